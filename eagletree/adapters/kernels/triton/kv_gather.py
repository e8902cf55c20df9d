"""Triton: gather each request's KV rows (prefix, then tail) into one packed, contiguous tensor."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gather_kv_rows_kernel(
    src_ptr,
    dst_ptr,
    req_to_token_ptr,
    req_pool_indices_ptr,
    prefix_lens_ptr,
    tail_slots_ptr,
    tail_indptr_ptr,
    dst_indptr_ptr,
    stride_src,
    stride_dst,
    stride_table,
    row_numel,
    HAS_TAIL: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    req = tl.program_id(0)
    first = tl.program_id(1) * BLOCK_ROWS
    prefix_len = tl.load(prefix_lens_ptr + req).to(tl.int32)
    if HAS_TAIL:
        tail_start = tl.load(tail_indptr_ptr + req)
        tail_len = (tl.load(tail_indptr_ptr + req + 1) - tail_start).to(tl.int32)
    else:
        tail_len = 0
    num_rows = prefix_len + tail_len
    if first >= num_rows:
        return
    offs = first + tl.arange(0, BLOCK_ROWS)
    valid = offs < num_rows
    in_prefix = offs < prefix_len
    table_row = tl.load(req_pool_indices_ptr + req).to(tl.int64) * stride_table
    slot = tl.load(req_to_token_ptr + table_row + offs, mask=valid & in_prefix, other=0)
    slot = slot.to(tl.int64)
    if HAS_TAIL:
        tail_slot = tl.load(
            tail_slots_ptr + tail_start + offs - prefix_len, mask=valid & ~in_prefix, other=0
        )
        slot = tl.where(in_prefix, slot, tail_slot.to(tl.int64))
    dst_row = tl.load(dst_indptr_ptr + req).to(tl.int64) + offs
    for col in range(0, row_numel, BLOCK_COLS):
        cols = col + tl.arange(0, BLOCK_COLS)
        io_mask = valid[:, None] & (cols[None, :] < row_numel)
        rows = tl.load(src_ptr + slot[:, None] * stride_src + cols[None, :], mask=io_mask)
        tl.store(
            dst_ptr + dst_row[:, None] * stride_dst + cols[None, :],
            rows.to(dst_ptr.dtype.element_ty),
            mask=io_mask,
        )


def gather_kv_rows(
    src: torch.Tensor,
    dst: torch.Tensor,
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    dst_indptr: torch.Tensor,
    max_rows_per_req: int,
    tail_slots: torch.Tensor | None = None,
    tail_indptr: torch.Tensor | None = None,
) -> None:
    """``dst[dst_indptr[b] + j] = src[slot_b(j)]`` converted to ``dst.dtype``, for j < rows_b.

    Request b's rows are its prefix ``req_to_token[req_pool_indices[b], :prefix_lens[b]]`` then,
    with a tail, ``tail_slots[tail_indptr[b] : tail_indptr[b + 1]]``. ``max_rows_per_req`` is a
    host upper bound of ``rows_b`` (it sizes the grid); rows of ``dst`` outside the requests'
    ranges are left untouched.
    """
    # src: (slots, *row) with contiguous rows; dst: (dst_rows, *row) contiguous
    bs = prefix_lens.shape[0]
    if bs == 0 or max_rows_per_req <= 0:
        return
    row_numel = src[0].numel()
    assert src[0].is_contiguous() and dst.is_contiguous() and dst[0].numel() == row_numel
    block_rows = 16 if src.device.type == "cpu" else 32
    block_cols = min(triton.next_power_of_2(row_numel), 1024)
    has_tail = tail_slots is not None and tail_indptr is not None
    grid = (bs, triton.cdiv(max_rows_per_req, block_rows))
    _gather_kv_rows_kernel[grid](
        src,
        dst,
        req_to_token,
        req_pool_indices,
        prefix_lens,
        tail_slots if has_tail else prefix_lens,
        tail_indptr if has_tail else prefix_lens,
        dst_indptr,
        src.stride(0),
        dst.stride(0),
        req_to_token.stride(0),
        row_numel,
        HAS_TAIL=has_tail,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
    )
