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
    num_q_heads,
    num_splits,
    stride_ot,
    stride_oh,
    DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    # one program per (token, head) row, every split of it in one block: the merge is a few
    # dependent loads deep whatever the split count, so it stays far cheaper than the attention
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    split_ok = offs_s < num_splits
    part = row * num_splits + offs_s
    lse = tl.load(part_lse_ptr + part, mask=split_ok, other=float("-inf"))
    o = tl.load(
        part_o_ptr + part[:, None] * DV + offs_dv[None, :],
        mask=split_ok[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    )
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    weight = tl.exp2(lse - m_safe)  # 0 for splits that saw no key
    total = tl.sum(weight, axis=0)
    acc = tl.sum(o * weight[:, None], axis=0)
    out = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), 0.0)
    token = row // num_q_heads
    head = row % num_q_heads
    tl.store(
        o_ptr + token * stride_ot + head * stride_oh + offs_dv,
        out.to(o_ptr.dtype.element_ty),
        mask=offs_dv < DV,
    )


def merge_splits(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Combine per-split partial outputs by their log2-sum-exp into ``out`` (its dtype)."""
    # part_o: (T, H, S, Dv) fp32; part_lse: (T, H, S) fp32 log2 units; out: (T, H, Dv)
    num_tokens, num_heads, num_splits, value_dim = part_o.shape
    num_rows = num_tokens * num_heads
    if num_rows == 0:
        return
    _merge_splits_kernel[(num_rows,)](
        part_o,
        part_lse,
        out,
        num_heads,
        num_splits,
        out.stride(0),
        out.stride(1),
        DV=value_dim,
        BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        BLOCK_DV=max(16, triton.next_power_of_2(value_dim)),
    )
