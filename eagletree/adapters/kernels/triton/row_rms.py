"""Triton: a row's inverse RMS, ``rsqrt(mean(x²) + eps)`` in fp32 — the statistic of RMSNorm,
for kernels that apply a norm folded into the GEMM before them (``layers.fold_rms_weight``)."""

from __future__ import annotations

import triton
import triton.language as tl

# columns per load of the statistic: a hidden size up to 4096 is one load round (an 8B
# model's stream from L2 in one trip instead of a serial loop of four)
NORM_BLOCK = 4096


def norm_block(width: int) -> int:
    """``inverse_rms``'s BLOCK for rows ``width`` wide (1 when there is no row to read)."""
    block: int = triton.next_power_of_2(max(width, 1))
    return min(NORM_BLOCK, block)


@triton.jit
def inverse_rms(row_ptr, width, eps, BLOCK: tl.constexpr):
    # row_ptr: the row's first element (unit column stride) -> a scalar fp32
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
        total += x * x
    return tl.math.rsqrt(tl.sum(total, axis=0) / width + eps)
