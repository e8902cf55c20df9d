"""Triton: the compaction plan of a verify result in one launch (``domain.compaction``).

The reference builds the KV move pairs and the row indices with about twenty small torch ops;
one program per request computes them from its accepted path, its accept length and its verify
slots. Integer outputs equal ``domain.compaction.compaction_plan``'s bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.domain.compaction import CompactionPlan


@triton.jit
def _compaction_plan_kernel(
    accept_index_ptr,  # (bs, W) int32 global node ids, −1 past the path
    accept_length_ptr,  # (bs,)
    verify_slots_ptr,  # (bs·N,)
    tgt_ptr,  # (bs·W,) int64 out
    src_ptr,  # (bs·W,) int64 out
    path_rows_ptr,  # (bs·R,) int64 out
    front_rows_ptr,  # (bs·R,) int64 out
    n,
    width,
    rows,
    BLOCK_W: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    step = tl.arange(0, BLOCK_W)
    in_width = step < width
    node = tl.load(accept_index_ptr + req * width + step, mask=in_width, other=-1).to(tl.int64)
    length = tl.load(accept_length_ptr + req).to(tl.int64)
    front = req * n + step
    tgt = tl.load(verify_slots_ptr + req * n + tl.minimum(step, n - 1), mask=in_width, other=0)
    src = tl.load(verify_slots_ptr + tl.maximum(node, 0), mask=in_width, other=0)
    tgt, src = tgt.to(tl.int64), src.to(tl.int64)
    moving = (step <= length) & (tgt != src)
    tl.store(tgt_ptr + req * width + step, tl.where(moving, tgt, 0), mask=in_width)
    tl.store(src_ptr + req * width + step, tl.where(moving, src, 0), mask=in_width)
    in_rows = step < rows
    tl.store(path_rows_ptr + req * rows + step, tl.where(node >= 0, node, front), mask=in_rows)
    tl.store(front_rows_ptr + req * rows + step, front, mask=in_rows)


def compaction_plan(
    accept_index: torch.Tensor,
    accept_length: torch.Tensor,
    verify_slots: torch.Tensor,
    num_draft_tokens: int,
) -> CompactionPlan:
    """``domain.compaction.compaction_plan`` in one launch; the same arguments and result."""
    # accept_index: (bs, S+1); accept_length: (bs,); verify_slots: (bs·N,)
    bs, width = accept_index.shape
    n = num_draft_tokens
    rows = min(width, n)
    device = accept_index.device
    tgt = torch.empty(bs * width, dtype=torch.int64, device=device)
    src = torch.empty_like(tgt)
    path_rows = torch.empty(bs * rows, dtype=torch.int64, device=device)
    front_rows = torch.empty_like(path_rows)
    if bs > 0:
        _compaction_plan_kernel[(bs,)](
            accept_index.contiguous(),
            accept_length.contiguous(),
            verify_slots.contiguous(),
            tgt,
            src,
            path_rows,
            front_rows,
            n,
            width,
            rows,
            BLOCK_W=max(16, triton.next_power_of_2(width)),
            num_warps=1,
        )
    return CompactionPlan(tgt, src, path_rows, front_rows)
