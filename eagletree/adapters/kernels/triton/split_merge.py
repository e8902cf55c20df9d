"""Triton: merge of split-KV partial attention outputs by log-sum-exp (flash-decoding's pass 2).

Split s of a row wrote its normalised output o_s and log2-sum-exp lse_s; the row's output is
``Σ_s 2^(lse_s − m) · o_s / Σ_s 2^(lse_s − m)`` with m the largest lse (rows that saw no key in
any split give zeros).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# rows a merge program takes: one row per program leaves a verify of 256 tokens x 32 heads
# with 8192 programs of 256 elements each, whose launch and scheduling cost more than the
# merge (8 µs a layer on the H200 against 1.9 µs for a bs-32 decode's 1024 rows)
MAX_ROWS_PER_PROGRAM = 8
ROWS_PER_PROGRAM_FROM = 1024  # fewer rows: one per program, to keep every SM busy


def rows_per_program(num_rows: int) -> int:
    """A power of two: 1 up to ``ROWS_PER_PROGRAM_FROM`` rows, then as many as keep about that
    many programs, at most ``MAX_ROWS_PER_PROGRAM``."""
    wanted = max(1, num_rows // ROWS_PER_PROGRAM_FROM)
    return min(MAX_ROWS_PER_PROGRAM, 1 << (wanted.bit_length() - 1))


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
    ROWS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    # ROWS (token, head) rows per program, every split of each in one block: the merge is a
    # few dependent loads deep whatever the split count, so it stays far cheaper than the
    # attention
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = rows < num_rows
    split_ok = (offs_s < num_splits)[None, :] & row_ok[:, None]  # (ROWS, BLOCK_S)
    part = rows[:, None] * num_splits + offs_s[None, :]
    lse = tl.load(part_lse_ptr + part, mask=split_ok, other=float("-inf"))
    o = tl.load(
        part_o_ptr + part[:, :, None] * DV + offs_dv[None, None, :],
        mask=split_ok[:, :, None] & (offs_dv < DV)[None, None, :],
        other=0.0,
    )  # (ROWS, BLOCK_S, BLOCK_DV)
    m = tl.max(lse, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    weight = tl.exp2(lse - m_safe[:, None])  # 0 for splits that saw no key
    total = tl.sum(weight, axis=1)
    acc = tl.sum(o * weight[:, :, None], axis=1)  # (ROWS, BLOCK_DV)
    safe_total = tl.where(total > 0, total, 1.0)
    out = tl.where(total[:, None] > 0, acc / safe_total[:, None], 0.0)
    token = rows // num_q_heads
    head = rows % num_q_heads
    tl.store(
        o_ptr + (token * stride_ot + head * stride_oh)[:, None] + offs_dv[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv < DV)[None, :],
    )


def merge_splits(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Combine per-split partial outputs by their log2-sum-exp into ``out`` (its dtype)."""
    # part_o: (T, H, S, Dv) fp32; part_lse: (T, H, S) fp32 log2 units; out: (T, H, Dv)
    num_tokens, num_heads, num_splits, value_dim = part_o.shape
    num_rows = num_tokens * num_heads
    if num_rows == 0:
        return
    rows = rows_per_program(num_rows)
    _merge_splits_kernel[(triton.cdiv(num_rows, rows),)](
        part_o,
        part_lse,
        out,
        num_rows,
        num_heads,
        num_splits,
        out.stride(0),
        out.stride(1),
        DV=value_dim,
        ROWS=rows,
        BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        BLOCK_DV=max(16, triton.next_power_of_2(value_dim)),
    )
