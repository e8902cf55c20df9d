"""Triton: ``silu(gate) * up`` over the merged gate/up projection's output, in one pass.

The rounding is torch's for ``silu(gate) * up`` in the activation dtype: SiLU evaluated in fp32
and rounded, then the product of two activation-dtype values rounded once more.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,
    out_ptr,
    stride_in,
    stride_out,
    width,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + width + cols, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(num_tokens, 2·I) ``[gate; up]`` -> (num_tokens, I) ``silu(gate) * up`` in its dtype."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(
            f"silu_and_mul needs (tokens, 2·I) with unit column stride, got"
            f" {tuple(gate_up.shape)} strides {gate_up.stride()}"
        )
    num_tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(num_tokens, width, dtype=gate_up.dtype, device=gate_up.device)
    if num_tokens == 0 or width == 0:
        return out
    block = min(triton.next_power_of_2(width), 1024)
    grid = (num_tokens, triton.cdiv(width, block))
    _silu_and_mul_kernel[grid](
        gate_up, out, gate_up.stride(0), out.stride(0), width, BLOCK=block, num_warps=4
    )
    return out
