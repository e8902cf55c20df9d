"""Triton: ``x @ weight.T`` for a few token rows (decode and small verify batches).

At 1–64 rows a linear layer is a stream over its weight: the arithmetic is free and the time is
the bytes. On an 8B model's shapes cuBLAS reaches 4.1 TB/s on the wide gate/up weight but runs
o_proj (4096 → 4096) and down_proj as a split-K GEMM plus a reduce kernel, at 2.5 and 3.6 TB/s
(``benchmarks/gemm.py``). Here each program owns ``BLOCK_N`` output columns for every row and
walks the whole K range, so there is no reduction kernel and the weight is read exactly once;
narrow ``BLOCK_N`` gives enough programs to cover every SM.

Accumulation is fp32 over ``BLOCK_K`` chunks; the order of the sum differs from cuBLAS's, so
results agree with ``torch.nn.functional.linear`` to a stated tolerance, not bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class SkinnyConfig(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


MAX_ROWS = 64  # above this the GEMM is no longer a weight stream; cuBLAS's tiles win


def default_config(cols: int, rows: int, element_size: int = 2) -> SkinnyConfig:
    """The fastest tile of the H200 sweeps (``benchmarks/gemm.py``, bf16): 32 columns and long
    K steps for hidden-sized outputs, 64 columns and short K steps for vocabulary-sized ones
    (from 16k columns: a 32k draft vocabulary streams at 4.1 TB/s with them, 3.9 with the
    hidden-sized tile, 3.2 at 64 rows), three stages where the sweep preferred them (the 32k
    vocabulary, and any vocabulary from 32 rows). K steps shrink as the row tile or the element
    grows (fp32 operands take twice the bytes) so that the pipeline stages of both operands
    stay inside the 228 KB of shared memory."""
    block_n = 64 if cols >= 16384 else 32
    num_stages = 3 if block_n == 64 and (cols < 65536 or rows >= 32) else 4
    tile_rows = max(16, triton.next_power_of_2(rows))
    budget = 192 * 1024 // (4 * element_size * (tile_rows + block_n))  # 4 stages, K per step
    block_k = min(128 if block_n == 64 else 512, triton.next_power_of_2(budget + 1) // 2)
    return SkinnyConfig(block_n=block_n, block_k=block_k, num_warps=4, num_stages=num_stages)


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    residual_ptr,
    out_ptr,
    copy_ptr,
    rows,
    cols,
    depth,
    stride_x,
    stride_w,
    stride_residual,
    stride_out,
    stride_copy,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_COPY: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_mask = offs_m < rows
    col_mask = offs_n < cols
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_x
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, depth, BLOCK_K):
        ks = k0 + offs_k
        k_mask = ks < depth
        x = tl.load(x_rows + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_rows + ks[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0)
        if DOT_FP32:  # the interpreter's bf16 dot is wrong; fp32 inputs want exact products
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tile_mask = row_mask[:, None] & col_mask[None, :]
    if HAS_RESIDUAL:
        res = residual_ptr + offs_m[:, None].to(tl.int64) * stride_residual + offs_n[None, :]
        acc += tl.load(res, mask=tile_mask, other=0.0).to(tl.float32)
    out = out_ptr + offs_m[:, None].to(tl.int64) * stride_out + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=tile_mask)
    if HAS_COPY:
        copy = copy_ptr + offs_m[:, None].to(tl.int64) * stride_copy + offs_n[None, :]
        tl.store(copy, acc.to(copy_ptr.dtype.element_ty), mask=tile_mask)


def skinny_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
    residual: torch.Tensor | None = None,
    copy_to: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (rows ≤ MAX_ROWS, K) · weight (N, K)ᵀ (+ bias (N,)) (+ residual (rows, N)) -> (rows, N)
    in x's dtype; the residual is added to the fp32 sum, so the result is rounded once.
    ``copy_to`` (rows, N) in x's dtype, any row stride (the columns of a wider tensor): the
    result is stored there too, by the same kernel (EAGLE-3's capture of a layer's output)."""
    if (
        x.dim() != 2
        or weight.dim() != 2
        or x.shape[1] != weight.shape[1]
        or x.stride(-1) != 1
        or weight.stride(-1) != 1
        or x.shape[0] > MAX_ROWS
    ):
        raise ValueError(
            f"skinny_gemm needs x (rows ≤ {MAX_ROWS}, K) and weight (N, K), both with unit"
            f" column stride; got x {tuple(x.shape)} strides"
            f" {x.stride()}, weight {tuple(weight.shape)} strides {weight.stride()}"
        )
    rows, depth = x.shape
    cols = weight.shape[0]
    if residual is not None and (residual.shape != (rows, cols) or residual.stride(-1) != 1):
        raise ValueError(
            f"skinny_gemm: the residual must be ({rows}, {cols}) with unit column stride, got"
            f" {tuple(residual.shape)} strides {residual.stride()}"
        )
    if copy_to is not None and (
        copy_to.shape != (rows, cols) or copy_to.stride(-1) != 1 or copy_to.dtype != x.dtype
    ):
        raise ValueError(
            f"skinny_gemm: copy_to must be ({rows}, {cols}) {x.dtype} with unit column stride,"
            f" got {tuple(copy_to.shape)} {copy_to.dtype} strides {copy_to.stride()}"
        )
    config = config or default_config(cols, rows, x.element_size())
    out = torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    if rows == 0 or cols == 0:
        return out
    dot_fp32 = x.device.type == "cpu" or x.dtype == torch.float32
    block_m = max(16, triton.next_power_of_2(rows))  # tl.dot's smallest tile is 16 rows
    grid = (triton.cdiv(cols, config.block_n),)
    _skinny_gemm_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,  # never read without HAS_BIAS
        residual if residual is not None else weight,  # never read without HAS_RESIDUAL
        out,
        copy_to if copy_to is not None else out,  # never written without HAS_COPY
        rows,
        cols,
        depth,
        x.stride(0),
        weight.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        copy_to.stride(0) if copy_to is not None else 0,
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None,
        HAS_COPY=copy_to is not None,
        DOT_FP32=dot_fp32,
        PRECISION="ieee" if dot_fp32 else None,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
