"""Triton: merge of split-KV partial attention outputs by log-sum-exp (flash-decoding's pass 2).

Split s of a row wrote its normalised output o_s and log2-sum-exp lse_s; the row's output is
``Σ_s 2^(lse_s − m) · o_s / Σ_s 2^(lse_s − m)`` with m the largest lse (rows that saw no key in
any split give zeros).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_splits_kernel(
    part_o_ptr,
    part_lse_ptr,
    o_ptr,
    num_rows,
    num_q_heads,
    num_splits,
    stride_ot,
    stride_oh,
    DV: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_valid = rows < num_rows
    offs_dv = tl.arange(0, BLOCK_DV)
    io_mask = row_valid[:, None] & (offs_dv[None, :] < DV)
    rows64 = rows.to(tl.int64)
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    for split in range(0, num_splits):
        part = rows64 * num_splits + split
        lse = tl.load(part_lse_ptr + part, mask=row_valid, other=float("-inf"))
        o = tl.load(part_o_ptr + part[:, None] * DV + offs_dv[None, :], mask=io_mask, other=0.0)
        m_new = tl.maximum(m_i, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        weight = tl.exp2(lse - m_safe)
        acc = acc * alpha[:, None] + o * weight[:, None]
        l_i = l_i * alpha + weight
        m_i = m_new
    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    token = rows64 // num_q_heads
    head = rows64 % num_q_heads
    o_row = token * stride_ot + head * stride_oh
    tl.store(
        o_ptr + o_row[:, None] + offs_dv[None, :], out.to(o_ptr.dtype.element_ty), mask=io_mask
    )


def merge_splits(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Combine per-split partial outputs by their log2-sum-exp into ``out`` (its dtype)."""
    # part_o: (T, H, S, Dv) fp32; part_lse: (T, H, S) fp32 log2 units; out: (T, H, Dv)
    num_tokens, num_heads, num_splits, value_dim = part_o.shape
    block_r = 16
    num_rows = num_tokens * num_heads
    _merge_splits_kernel[(triton.cdiv(num_rows, block_r),)](
        part_o,
        part_lse,
        out,
        num_rows,
        num_heads,
        num_splits,
        out.stride(0),
        out.stride(1),
        DV=value_dim,
        BLOCK_R=block_r,
        BLOCK_DV=max(16, triton.next_power_of_2(value_dim)),
    )
