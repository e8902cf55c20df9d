"""The tolerance table of the fused kernels against their torch references (docs/kernels.md).

Computing kernels: fp32 to 1e-5 (the order of a row's sum of squares, ``exp`` and ``rsqrt``
implementations, FMA contraction); bf16 to two units in the last place (``rtol = 2**-6``): on
CUDA the kernels round like torch's elementwise ops, while the CPU interpreter truncates its
fp32 -> bf16 casts. Where a kernel subtracts rounded products (RoPE) the absolute tolerance
is that relative tolerance times the operands' magnitude (``scale``), since a difference of
near-equal products keeps their rounding error, not its own size. Copies and the residual sum
are bit-exact wherever the rounding is torch's (fp32 everywhere, bf16 on CUDA).
"""

from __future__ import annotations

import torch

from tests.conftest import triton_interpreted

COMPUTED = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2**-6, "atol": 1e-5},
}


def rounded_like_torch(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a kernel's casts to ``dtype`` round as torch's do (not the interpreter's bf16)."""
    return dtype == torch.float32 or not (device.type == "cpu" and triton_interpreted())


def assert_computed_close(
    ours: torch.Tensor, reference: torch.Tensor, scale: float | None = None
) -> None:
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    rtol, atol = COMPUTED[reference.dtype]["rtol"], COMPUTED[reference.dtype]["atol"]
    if scale is not None:
        atol = max(atol, rtol * scale)
    torch.testing.assert_close(ours, reference, rtol=rtol, atol=atol)


def assert_rounded_sum_equal(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """A single rounded fp32 sum: bit-exact where rounding is torch's, one ulp otherwise."""
    if rounded_like_torch(ours.device, reference.dtype):
        assert torch.equal(ours, reference)
    else:
        torch.testing.assert_close(ours, reference, rtol=2**-7, atol=0)
