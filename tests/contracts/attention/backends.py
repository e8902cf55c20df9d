"""The backends under contract, the modes, dtypes, shapes and tolerances they are
checked in, and random cases with the torch reference's output on an identical twin."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from eagletree.adapters.attention.flash_backend import FlashAttentionBackend
from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.domain.batch import ForwardMode
from eagletree.domain.tree import TreeMaskMode
from eagletree.ports.attention import AttentionBackend
from tests.conftest import requires_triton
from tests.contracts.attention.cases import AttentionCase, Shape, make_case
from tests.contracts.attention.emulated_flash import emulated_flash_varlen

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
