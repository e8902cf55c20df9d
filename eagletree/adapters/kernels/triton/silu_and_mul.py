"""Triton: ``silu(gate) * up`` over the merged gate/up projection's output, in one pass.

The rounding is torch's for ``silu(gate) * up`` in the activation dtype: SiLU evaluated in fp32
and rounded, then the product of two activation-dtype values rounded once more.

With ``norm_of`` the gate/up GEMM read a residual stream whose RMSNorm was folded away (its
weight into the GEMM, ``layers.fold_rms_weight``): gate and up are first scaled by the token's
``rsqrt(mean(stream²) + eps)`` and rounded, as the GEMM's output would have been.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.row_rms import inverse_rms, norm_block


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,
    norm_ptr,
    out_ptr,
    stride_in,
    stride_norm,
    stride_out,
    width,
    norm_width,
    eps,
    BLOCK: tl.constexpr,
    HAS_NORM: tl.constexpr,
    BLOCK_NORM: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + width + cols, mask=mask, other=0.0)
    if HAS_NORM:
        scale = inverse_rms(norm_ptr + row * stride_norm, norm_width, eps, BLOCK_NORM)
        act = out_ptr.dtype.element_ty
        gate = (gate * scale).to(act).to(tl.float32)
        up = (up.to(tl.float32) * scale).to(act)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def silu_and_mul(
    gate_up: torch.Tensor, norm_of: torch.Tensor | None = None, eps: float = 0.0
) -> torch.Tensor:
    """(num_tokens, 2·I) ``[gate; up]`` -> (num_tokens, I) ``silu(gate) * up`` in its dtype;
    with ``norm_of`` (num_tokens, H), gate and up first scaled by each row's inverse RMS of it."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(
            f"silu_and_mul needs (tokens, 2·I) with unit column stride, got"
            f" {tuple(gate_up.shape)} strides {gate_up.stride()}"
        )
    if norm_of is not None and (
        norm_of.dim() != 2 or norm_of.shape[0] != gate_up.shape[0] or norm_of.stride(-1) != 1
    ):
        raise ValueError(
            f"silu_and_mul: norm_of must be ({gate_up.shape[0]}, H) with unit column stride,"
            f" got {tuple(norm_of.shape)} strides {norm_of.stride()}"
        )
    norm_width = 0 if norm_of is None else norm_of.shape[1]
    num_tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(num_tokens, width, dtype=gate_up.dtype, device=gate_up.device)
    if num_tokens == 0 or width == 0:
        return out
    block = min(triton.next_power_of_2(width), 1024)
    grid = (num_tokens, triton.cdiv(width, block))
    _silu_and_mul_kernel[grid](
        gate_up,
        norm_of if norm_of is not None else gate_up,  # never read without HAS_NORM
        out,
        gate_up.stride(0),
        norm_of.stride(0) if norm_of is not None else 0,
        out.stride(0),
        width,
        norm_width,
        eps,
        BLOCK=block,
        HAS_NORM=norm_of is not None,
        BLOCK_NORM=norm_block(norm_width),
        num_warps=4,
    )
    return out
