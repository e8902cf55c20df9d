"""Contract tests of AttentionBackend: every adapter against the torch reference, in
every mode. CPU: Triton under ``TRITON_INTERPRET=1`` (fp32/fp16, small shapes) and the
emulated FlashAttention; CUDA: Triton and FlashAttention natively, bf16 too. The pool
writes are bit-exact; fp8 storage, ``save_kv=False`` and empty batches included."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.batch import ForwardBatch, ForwardMode
from tests.contracts.attention.backends import (
    BACKENDS,
    CHECKED_BACKENDS,
    CPU_SHAPES,
    GPU_SHAPES,
    MODES,
    TOLERANCE,
    assert_pool_holds_new_tokens,
    backend_factory,
    dtypes_for,
    random_case,
    random_twins,
    run,
)
from tests.contracts.attention.cases import Shape, make_case


@pytest.mark.parametrize("backend", CHECKED_BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_backend_matches_the_reference_and_writes_the_pool(
    backend: str, mode: ForwardMode, device: torch.device
) -> None:
    factory = backend_factory(backend, device)
    shapes = GPU_SHAPES if device.type == "cuda" else CPU_SHAPES
    for index, (shape_name, shape) in enumerate(shapes.items()):
        if backend.startswith("flash") and shape.head_dim > 256:
            continue  # refused at construction, see test_flash_backend_refuses_what_it_cannot_run
        for dtype in dtypes_for(device, backend):
            seed = 100 * index + 7 * list(TOLERANCE).index(dtype) + MODES.index(mode)
            case, expected = random_twins(mode, shape, device, dtype, seed)
            out = run(factory(case), case)
            atol, rtol = TOLERANCE[dtype]
            assert out.dtype == dtype and out.shape == expected.shape, shape_name
            torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol)
            assert_pool_holds_new_tokens(case)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", list(ForwardMode), ids=lambda m: m.name)
def test_empty_batch_returns_an_empty_output_without_tree_indices(
    backend: str, mode: ForwardMode, device: torch.device
) -> None:
    template = make_case(
        ForwardMode.DECODE, Shape(4, 2, 64, 64), [3], device=device, dtype=torch.float16, seed=0
    )
    factory = backend_factory(backend, device)
    empty = torch.empty(0, dtype=torch.int64, device=device)
    batch = ForwardBatch(mode, empty, empty, empty, empty, empty, extend_lens=empty)
    q = torch.empty(0, 4, 64, dtype=torch.float16, device=device)
    kv = torch.empty(0, 2, 64, dtype=torch.float16, device=device)
    backend_impl = factory(template)
    backend_impl.init_forward_metadata(batch)
    out = backend_impl.forward(q, kv, kv, template.layer, batch)
    assert out.shape == (0, 4 * 64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_save_kv_false_reads_rows_already_in_the_pool(
    backend: str, mode: ForwardMode, device: torch.device
) -> None:
    factory = backend_factory(backend, device)
    case = random_case(mode, Shape(8, 2, 64, 64), device, torch.float16, 21, bs=2)
    expected = run(factory(case), case)  # writes the new rows
    again = run(factory(case), case, save_kv=False)
    torch.testing.assert_close(again, expected, atol=0, rtol=0)


@pytest.mark.parametrize("backend", CHECKED_BACKENDS)
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY], ids=str)
def test_fp8_storage_is_converted_to_the_compute_dtype(
    backend: str, mode: ForwardMode, device: torch.device
) -> None:
    factory = backend_factory(backend, device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    case, expected = random_twins(
        mode, Shape(8, 2, 64, 64), device, dtype, 31, bs=3, store_dtype=torch.float8_e4m3fn
    )
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(run(factory(case), case).float(), expected, atol=atol, rtol=rtol)
    assert_pool_holds_new_tokens(case)
