"""Contract tests of AttentionBackend: every adapter against the torch reference, in every mode.

CPU: the torch reference everywhere, Triton under ``TRITON_INTERPRET=1`` (fp32/fp16, small
shapes). CUDA: the same tests natively for torch, Triton and FlashAttention, plus bf16 and a
host-sync check. The torch reference itself is checked against a naive per-query SDPA loop, in
every mode, dtype and storage the other backends are compared in (never against itself).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.adapters.attention.flash_backend import FlashAttentionBackend
from eagletree.adapters.attention.metadata import tree_tail_bits, tree_tail_mask
from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.kernels.triton.tree_bits import pack_tree_bits
from eagletree.domain.batch import ForwardBatch, ForwardMode, TargetVerifySpec
from eagletree.domain.tree import TreeMaskMode
from eagletree.ports.attention import AttentionBackend
from tests.conftest import requires_cuda, requires_triton
from tests.contracts.attention_cases import (
    AttentionCase,
    Shape,
    emulated_flash_varlen,
    make_case,
    naive_attention,
)

# "flash-emulated": the FlashAttention backend with a torch stand-in for the FlashAttention call,
# so that its gather, cascade and merge run on CPU too (both LSE layouts FA versions return)
BACKENDS = ["torch", "triton", "flash", "flash-emulated"]
CHECKED_BACKENDS = [b for b in BACKENDS if b != "torch"]  # compared with the torch reference
MODES: list[ForwardMode] = [m for m in ForwardMode if m is not ForwardMode.IDLE]
# (atol, rtol) against the fp32 reference; the kernels round their output to the input dtype
TOLERANCE = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2.5e-2, 2.5e-2),
}
CPU_SHAPES = {  # head_dim 64 and 128, GQA ratios 1, 4 and 8, and a small MLA (latent 32 + rope 16)
    "mha-r1-d64": Shape(2, 2, 64, 64),
    "gqa-r4-d64": Shape(8, 2, 64, 64),
    "gqa-r8-d128": Shape(8, 1, 128, 128),
    "mla-32+16": Shape.mla(4, 32, 16),
}
GPU_SHAPES = {**CPU_SHAPES, "mla-512+64": Shape.mla(16, 512, 64)}

Factory = Callable[[AttentionCase], AttentionBackend]


def backend_factory(name: str, device: torch.device, **options: int) -> Factory:
    """A constructor of the named backend for ``device``, or a skip when it cannot run there."""
    if name == "triton":
        requires_triton(device)
        return lambda case: TritonAttentionBackend(case.pool, case.req_to_token, **options)
    if name == "flash":
        if device.type != "cuda":
            pytest.skip("FlashAttention runs on CUDA only")
        return lambda case: FlashAttentionBackend(case.pool, case.req_to_token)
    if name == "flash-emulated":
        if device.type != "cpu":
            pytest.skip("the emulation runs on CPU; CUDA runs the real kernels")
        requires_triton(device)  # the KV gather is a Triton kernel

        def emulated(case: AttentionCase) -> AttentionBackend:
            layout = "padded" if case.batch.batch_size % 2 else "packed"
            kernel = emulated_flash_varlen(layout)
            return FlashAttentionBackend(case.pool, case.req_to_token, varlen_kernel=kernel)

        return emulated
    return lambda case: TorchAttentionBackend(case.pool, case.req_to_token)


def run(backend: AttentionBackend, case: AttentionCase, save_kv: bool = True) -> torch.Tensor:
    backend.init_forward_metadata(case.batch)
    return backend.forward(case.q, case.k, case.v, case.layer, case.batch, save_kv=save_kv)


def reference_output(twin: AttentionCase) -> torch.Tensor:
    """The torch reference's output on ``twin``, an identical copy of the case under test."""
    return run(TorchAttentionBackend(twin.pool, twin.req_to_token), twin).float()


def random_case(
    mode: ForwardMode,
    shape: Shape,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    bs: int | None = None,
    **extra: object,
) -> AttentionCase:
    """A random batch: bs 0..5, prefixes 0, 1 or ragged, k in {1, 2, 4}, N 1..16, valid trees."""
    rng = random.Random(seed)
    bs = rng.randint(0, 5) if bs is None else bs
    prefix_lens = [rng.choice([0, 1, rng.randint(2, 45)]) for _ in range(bs)]
    topk = rng.choice([1, 2, 4])
    depth = rng.randint(0, 2)
    num_candidates = topk + depth * topk * topk  # k + (S−1)·k² with S = depth + 1 steps
    options: dict[str, object] = {
        "num_draft_tokens": rng.randint(1, min(16, num_candidates + 1)),
        "topk": topk,
        "depth": depth,
        "mask_mode": rng.choice(list(TreeMaskMode)),
    }
    if mode is ForwardMode.EXTEND:
        options["extend_lens"] = [rng.choice([0, 1, rng.randint(2, 9)]) for _ in range(bs)]
    if mode is ForwardMode.DRAFT_EXTEND:
        options["num_draft_tokens"] = rng.randint(1, 16)
    options.update(extra)
    return make_case(
        mode,
        shape,
        prefix_lens,
        device=device,
        dtype=dtype,
        seed=seed,
        **options,  # type: ignore[arg-type]
    )


def random_twins(*args: object, **kwargs: object) -> tuple[AttentionCase, torch.Tensor]:
    """A random case and the reference output computed on an identical twin (same seed)."""
    case = random_case(*args, **kwargs)  # type: ignore[arg-type]
    twin = random_case(*args, **kwargs)  # type: ignore[arg-type]
    return case, reference_output(twin)


def dtypes_for(device: torch.device, backend: str) -> list[torch.dtype]:
    if backend == "flash-emulated":
        return [torch.float16]
    if backend == "flash":
        return [torch.float16, torch.bfloat16]
    if device.type == "cuda":  # fp32 semantics are covered on CPU; each dtype is a GPU compile
        return [torch.float16, torch.bfloat16]
    return [torch.float32, torch.float16]


def assert_pool_holds_new_tokens(case: AttentionCase) -> None:
    for got, want in zip(case.pool_buffers(), case.expected_buffers(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # a write is a copy: bit-exact


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


@pytest.mark.parametrize("backend", CHECKED_BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_gpu_only_batch_without_host_lengths_matches_the_reference(
    backend: str, mode: ForwardMode, device: torch.device
) -> None:
    factory = backend_factory(backend, device)
    dtype = torch.float16
    for shape in (Shape(8, 2, 64, 64), Shape.mla(4, 32, 16)):
        case, expected = random_twins(mode, shape, device, dtype, 61, bs=4, gpu_only=True)
        assert case.batch.seq_lens_sum is None and case.batch.extend_lens_cpu is None
        atol, rtol = TOLERANCE[dtype]
        torch.testing.assert_close(run(factory(case), case).float(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("shape_name", ["gqa-r4-d64", "mla-32+16"])
@pytest.mark.parametrize("min_chunk", [None, 16, 96], ids=lambda c: f"min_chunk={c}")
def test_triton_split_key_ranges_merge_to_the_reference(
    mode: ForwardMode, shape_name: str, min_chunk: int | None, device: torch.device
) -> None:
    # target_programs far above the grid forces several splits of every request's keys; a
    # large min_chunk leaves some splits without keys, a small one gives every split a block
    chunk = {} if min_chunk is None else {"min_chunk": min_chunk}
    factory = backend_factory("triton", device, target_programs=4096, max_kv_splits=3, **chunk)
    case, expected = random_twins(mode, CPU_SHAPES[shape_name], device, torch.float32, 11, bs=3)
    torch.testing.assert_close(run(factory(case), case).float(), expected, atol=2e-5, rtol=2e-5)


def random_tree_spec(
    n: int, full: bool, seed: int, device: torch.device | str = "cpu"
) -> tuple[TargetVerifySpec, torch.Tensor]:
    """A spec over arbitrary random mask bits (packing needs no valid tree) and its seq_lens."""
    gen = torch.Generator().manual_seed(seed)
    bs = 3
    seq_lens = torch.randint(0, 9, (bs,), generator=gen)
    rows = n * (seq_lens + n) if full else torch.full((bs,), n * n)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(rows, 0)])
    flat = torch.rand(int(indptr[-1]), generator=gen) < 0.5
    mode = TreeMaskMode.FULL_MASK if full else TreeMaskMode.QLEN_ONLY
    spec = TargetVerifySpec(n, flat.to(device), mode, indptr.to(device))
    return spec, seq_lens.to(device)


@settings(max_examples=15, deadline=None)
@given(
    n=st.sampled_from([1, 5, 31, 32, 33, 64, 70]),
    full=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tree_bits_unpack_to_the_tree_part_of_the_mask(n: int, full: bool, seed: int) -> None:
    spec, seq_lens = random_tree_spec(n, full, seed)
    bs = seq_lens.shape[0]
    bits = tree_tail_bits(spec, seq_lens)
    assert bits.dtype == torch.int32 and bits.shape == (bs * n, (n + 31) // 32)
    column = torch.arange(32 * bits.shape[1])
    unpacked = (bits.to(torch.int64)[:, column // 32] >> (column % 32)) & 1  # (bs·N, 32·words)
    assert not unpacked[:, n:].any()  # bits past N stay clear
    expected = tree_tail_mask(spec, seq_lens).view(bs * n, n)
    torch.testing.assert_close(unpacked[:, :n].bool(), expected, rtol=0, atol=0)
    buffer = torch.full_like(bits, -7)  # a preallocated buffer keeps its address (CUDA graphs)
    written = tree_tail_bits(spec, seq_lens, out=buffer)
    assert written.data_ptr() == buffer.data_ptr() and torch.equal(buffer, bits)


@pytest.mark.parametrize("n", [1, 33, 70])
@pytest.mark.parametrize("full", [True, False], ids=["full", "qlen"])
def test_triton_packs_the_tree_bits_like_the_reference(
    n: int, full: bool, device: torch.device
) -> None:
    requires_triton(device)
    spec, seq_lens = random_tree_spec(n, full, seed=n, device=device)
    expected = tree_tail_bits(spec, seq_lens)
    out = torch.full_like(expected, -7)
    pack_tree_bits(spec.tree_mask, spec.mask_indptr, seq_lens, n, full, out)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("mode", "block_n", "split"),
    [(mode, 64, True) for mode in MODES] + [(ForwardMode.TARGET_VERIFY, 32, False)],
    ids=lambda v: v.name if isinstance(v, ForwardMode) else str(v),
)
def test_triton_long_prefixes_and_wide_trees_match_the_reference(
    mode: ForwardMode, block_n: int, split: bool, device: torch.device
) -> None:
    # prefixes of whole key blocks, a ragged end and none, so every kernel phase runs (unmasked
    # prefix blocks, the prefix's ragged end, tail blocks); N = 40 needs two bit words per node,
    # and with 64-key blocks one tail block spans both; splits cut through prefix and tail
    options = {"block_n": block_n} | (
        {"target_programs": 4096, "max_kv_splits": 3} if split else {}
    )
    factory = backend_factory("triton", device, **options)
    extra: dict[str, object] = {"num_draft_tokens": 40, "topk": 4, "depth": 3}
    if mode is ForwardMode.EXTEND:
        extra["extend_lens"] = [3, 40, 0, 17]
    shape = Shape(4, 2, 16, 16)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    twins = [
        make_case(mode, shape, [64, 77, 5, 0], device=device, dtype=dtype, seed=71, **extra)  # type: ignore[arg-type]
        for _ in range(2)
    ]
    expected = reference_output(twins[1])
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(
        run(factory(twins[0]), twins[0]).float(), expected, atol=atol, rtol=rtol
    )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"block_m": 16},
        {"block_m": 64},
        {"block_m": 128},
        {"block_n": 64, "num_stages": 2},
        {"max_registers": 0},
    ],
    ids=["default", "m16", "m64", "m128", "n64-s2", "no-register-cap"],
)
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY], ids=str)
def test_triton_tile_options_give_the_same_attention(
    options: dict[str, int], mode: ForwardMode, device: torch.device
) -> None:
    # the benchmark's tune sweep changes these; every choice must compute the same attention
    if device.type == "cpu" and set(options) - {"block_m", "block_n"}:
        pytest.skip("the interpreter ignores warps, stages and register caps")
    factory = backend_factory("triton", device, **options)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    # group 8 × N 32 = 256 rows per request: on the GPU the default is one 256-row tile
    case, expected = random_twins(
        mode, Shape(16, 2, 64, 64), device, dtype, 81, bs=2, num_draft_tokens=32, topk=4, depth=2
    )
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(run(factory(case), case).float(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("options", [{"block_n": 48}, {"block_m": 8}], ids=["n48", "m8"])
def test_triton_refuses_tile_sizes_that_are_not_powers_of_two_from_16(
    options: dict[str, int],
) -> None:
    case = make_case(
        ForwardMode.DECODE, Shape(4, 2, 64, 64), [2], device="cpu", dtype=torch.float32, seed=0
    )
    with pytest.raises(ValueError, match="power of two"):
        TritonAttentionBackend(case.pool, case.req_to_token, **options)


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


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY], ids=str)
def test_triton_caps_logits_like_the_reference(mode: ForwardMode, device: torch.device) -> None:
    factory = backend_factory("triton", device)
    shape = Shape(4, 2, 64, 64)
    case, expected = random_twins(mode, shape, device, torch.float32, 41, bs=3, logit_cap=2.0)
    _, uncapped = random_twins(mode, shape, device, torch.float32, 41, bs=3)
    assert not torch.allclose(uncapped, expected, atol=1e-3)  # the cap matters in this case
    torch.testing.assert_close(run(factory(case), case).float(), expected, atol=2e-5, rtol=2e-5)


def test_flash_backend_refuses_what_it_cannot_run(device: torch.device) -> None:
    if device.type != "cuda":
        case = make_case(
            ForwardMode.DECODE, Shape(4, 2, 64, 64), [2], device=device, dtype=torch.float16, seed=0
        )
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            FlashAttentionBackend(case.pool, case.req_to_token)
        return
    wide = make_case(
        ForwardMode.DECODE,
        GPU_SHAPES["mla-512+64"],
        [2],
        device=device,
        dtype=torch.bfloat16,
        seed=0,
    )
    with pytest.raises(ValueError, match="TritonAttentionBackend"):
        FlashAttentionBackend(wide.pool, wide.req_to_token)
    capped = make_case(
        ForwardMode.DECODE,
        Shape(4, 2, 64, 64),
        [2],
        device=device,
        dtype=torch.bfloat16,
        seed=0,
        logit_cap=5.0,
    )
    with pytest.raises(NotImplementedError, match="logit capping"):
        run(FlashAttentionBackend(capped.pool, capped.req_to_token), capped)


def test_forward_without_metadata_for_the_batch_is_an_error(device: torch.device) -> None:
    case = make_case(
        ForwardMode.DECODE, Shape(4, 2, 64, 64), [2], device=device, dtype=torch.float32, seed=0
    )
    backend = TorchAttentionBackend(case.pool, case.req_to_token)
    with pytest.raises(RuntimeError, match="init_forward_metadata"):
        backend.forward(case.q, case.k, case.v, case.layer, case.batch)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_gpu_only_batch_never_synchronises_with_the_host(backend: str, mode: ForwardMode) -> None:
    device = torch.device("cuda")
    factory = backend_factory(backend, device)
    for shape in (Shape(8, 2, 64, 64), Shape.mla(8, 32, 16)):
        case = random_case(
            mode,
            shape,
            device,
            torch.bfloat16,
            51,
            bs=4,
            gpu_only=True,
            mask_mode=TreeMaskMode.QLEN_ONLY,
        )
        assert case.batch.seq_lens_sum is None and case.batch.seq_lens_cpu is None
        impl = factory(case)
        expected = run(impl, case)  # compiles the kernels outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = run(impl, case)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(out, expected, atol=0, rtol=0)
