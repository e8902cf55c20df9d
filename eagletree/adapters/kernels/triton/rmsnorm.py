"""Triton: RMSNorm of token rows, alone or fused with the residual add before it.

Rounding follows the torch reference step for step (``eagletree.adapters.models.layers``):
statistics in fp32, the normalised row cast to the activation dtype, then multiplied by the
weight and rounded again; the residual add is one rounding of the fp32 sum. Only the order of
the sum of squares differs, so results agree with torch to the last bit or one unit in it.
One program per row; the whole row is one block (hidden sizes up to a few thousand).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    residual_out_ptr,
    copy_ptr,
    weight_ptr,
    out_ptr,
    stride_x,
    stride_residual,
    stride_residual_out,
    stride_copy,
    stride_out,
    hidden,
    eps,
    ADD_RESIDUAL: tl.constexpr,
    HAS_COPY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if ADD_RESIDUAL:
        res = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        summed = (x + res.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, summed, mask=mask)
        if HAS_COPY:
            tl.store(copy_ptr + row * stride_copy + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / hidden
    normed = (x * tl.math.rsqrt(mean_square + eps)).to(out_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (normed.to(tl.float32) * weight).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(-1) != 1 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"rmsnorm needs x (tokens, hidden) with unit column stride and weight (hidden,), got"
            f" x {tuple(x.shape)} strides {x.stride()} and weight {tuple(weight.shape)}"
        )


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor,
    residual_out: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    add_residual: bool,
    num_warps: int | None,
    copy_to: torch.Tensor | None = None,
) -> None:
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    _rmsnorm_kernel[(num_tokens,)](
        x,
        residual,
        residual_out,
        copy_to if copy_to is not None else residual_out,  # never written without HAS_COPY
        weight,
        out,
        x.stride(0),
        residual.stride(0),
        residual_out.stride(0),
        copy_to.stride(0) if copy_to is not None else 0,
        out.stride(0),
        hidden,
        eps,
        ADD_RESIDUAL=add_residual,
        HAS_COPY=copy_to is not None,
        BLOCK=triton.next_power_of_2(hidden),
        num_warps=num_warps or 8,
    )


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    *,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``weight * (x · rsqrt(mean(x²) + eps)).to(x.dtype)`` per row, into ``out`` (any row
    stride, e.g. the columns of a concatenation) or a new tensor. ``num_warps`` per row's
    program defaults to 8 (the H200 sweep, ``benchmarks/fused_kernels.py --norm-warps``: best or
    within 2 % from 1 to 256 rows of 4096, 3–7 % faster than 4)."""
    # x: (num_tokens, hidden) -> (num_tokens, hidden) in x's dtype
    _check(x, weight)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif out.shape != x.shape or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} does not fit x {tuple(x.shape)}")
    _launch(x, x, x, weight, out, eps, add_residual=False, num_warps=num_warps)
    return out


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual_out: torch.Tensor | None = None,
    *,
    copy_to: torch.Tensor | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_out = residual + x`` (rounded to the residual's dtype) and its RMSNorm.

    ``residual_out`` defaults to ``residual`` itself (updated in place); ``copy_to`` (any row
    stride: the columns of a wider tensor) gets the sum too, stored by the same kernel
    (EAGLE-3's capture of a layer's input). Returns (normed, residual_out); normed is a new
    tensor in x's dtype. ``num_warps`` as ``rmsnorm``.
    """
    # x, residual, residual_out: (num_tokens, hidden)
    _check(x, weight)
    if residual_out is None:
        residual_out = residual
    if residual.shape != x.shape or residual_out.shape != x.shape:
        raise ValueError(
            f"residual {tuple(residual.shape)} and residual_out {tuple(residual_out.shape)}"
            f" must have x's shape {tuple(x.shape)}"
        )
    if residual.stride(-1) != 1 or residual_out.stride(-1) != 1:
        raise ValueError("residual and residual_out need a unit column stride")
    if copy_to is not None and (
        copy_to.shape != x.shape or copy_to.stride(-1) != 1 or copy_to.dtype != residual_out.dtype
    ):
        raise ValueError(
            f"copy_to {tuple(copy_to.shape)} {copy_to.dtype} strides {copy_to.stride()} must"
            f" have x's shape {tuple(x.shape)}, the residual's dtype and a unit column stride"
        )
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, residual, residual_out, weight, out, eps, True, num_warps, copy_to=copy_to)
    return out, residual_out
