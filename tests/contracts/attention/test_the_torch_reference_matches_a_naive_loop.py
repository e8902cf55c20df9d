"""The torch reference itself against a naive per-query SDPA loop, in every mode,
shape, dtype, GPU-only batch and fp8 storage the other backends are compared in
(never against itself), its pool writes included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.domain.batch import ForwardMode
from tests.contracts.attention.backends import (
    CPU_SHAPES,
    GPU_SHAPES,
    MODES,
    TOLERANCE,
    assert_pool_holds_new_tokens,
    dtypes_for,
    random_case,
    run,
)
from tests.contracts.attention.cases import Shape
from tests.contracts.attention.naive_oracle import naive_attention


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("shape_name", list(CPU_SHAPES))
def test_reference_matches_a_naive_per_query_loop(
    mode: ForwardMode, shape_name: str, device: torch.device
) -> None:
    for seed in range(3):
        case = random_case(mode, CPU_SHAPES[shape_name], device, torch.float32, seed, bs=3)
        out = run(TorchAttentionBackend(case.pool, case.req_to_token), case)
        torch.testing.assert_close(out.float().cpu(), naive_attention(case), atol=2e-5, rtol=2e-5)


@settings(max_examples=30, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**16),
    gpu_only=st.booleans(),
)
def test_reference_matches_the_naive_loop_on_random_batches(
    mode: ForwardMode, seed: int, gpu_only: bool
) -> None:
    case = random_case(
        mode, Shape(4, 2, 16, 16), torch.device("cpu"), torch.float32, seed, gpu_only=gpu_only
    )
    out = run(TorchAttentionBackend(case.pool, case.req_to_token), case)
    torch.testing.assert_close(out.float(), naive_attention(case), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_the_torch_reference_matches_the_naive_loop_in_every_dtype_and_writes_the_pool(
    mode: ForwardMode, device: torch.device
) -> None:
    shapes = GPU_SHAPES if device.type == "cuda" else CPU_SHAPES
    variants: list[tuple[torch.dtype, dict[str, object]]] = [
        (dtype, {}) for dtype in dtypes_for(device, "torch")
    ]
    variants += [(torch.float16, {"bs": 4, "gpu_only": True})]
    variants += [(torch.float16, {"bs": 3, "store_dtype": torch.float8_e4m3fn})]
    for index, (shape_name, shape) in enumerate(shapes.items()):
        for number, (dtype, extra) in enumerate(variants):
            seed = 100 * index + 7 * number + MODES.index(mode)
            case = random_case(mode, shape, device, dtype, seed, **extra)  # type: ignore[arg-type]
            out = run(TorchAttentionBackend(case.pool, case.req_to_token), case)
            atol, rtol = TOLERANCE[dtype]
            assert out.dtype == dtype, shape_name
            torch.testing.assert_close(
                out.float().cpu(), naive_attention(case), atol=atol, rtol=rtol
            )
            assert_pool_holds_new_tokens(case)
