"""Triton: the ranks and offers along each request's accepted path in one launch
(``domain.accepted_path``).

The reference compares every pair of a tree's nodes and gathers along the path with about
fifteen small torch ops, which an adaptive engine's every drafting step runs; one program per
request reads its tree's parents once and walks its path. Outputs equal
``domain.accepted_path.accepted_path_ranks``'s bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _path_ranks_kernel(
    parents_ptr,  # (bs, N) int64 node → parent node, −1 the root
    accept_index_ptr,  # (bs, S + 1) int32 global node ids, root first, −1 past the path
    accept_length_ptr,  # (bs,) int32 accepted drafts
    out_ptr,  # (bs, 2·S) int64 out: ranks, then offers
    n,
    num_steps,
    BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, BLOCK_N)
    in_tree = node < n
    parents = tl.load(parents_ptr + req * n + node, mask=in_tree, other=-2)
    length = tl.load(accept_length_ptr + req).to(tl.int64)
    first = req * n
    width = num_steps + 1
    # the path's depth-0 node (the root; padding reads as the root, as in the reference)
    above = tl.maximum(tl.load(accept_index_ptr + req * width).to(tl.int64) - first, 0)
    for d in range(0, num_steps):
        here = tl.load(accept_index_ptr + req * width + d + 1).to(tl.int64) - first
        here = tl.maximum(here, 0)
        parent = tl.load(parents_ptr + req * n + here)
        rank = tl.sum(((parents == parent) & (node < here)).to(tl.int64), axis=0)
        offered = tl.sum((parents == above).to(tl.int64), axis=0)
        tl.store(out_ptr + req * 2 * num_steps + d, tl.where(d < length, rank, -1))
        tl.store(out_ptr + req * 2 * num_steps + num_steps + d, tl.where(d <= length, offered, 0))
        above = here


def accepted_path_ranks(
    parents: torch.Tensor, accept_index: torch.Tensor, accept_length: torch.Tensor
) -> torch.Tensor:
    """``domain.accepted_path.accepted_path_ranks`` in one launch; the same arguments and
    result: (bs, 2·S) int64, the ranks then the offers."""
    bs, n = parents.shape
    num_steps = accept_index.shape[1] - 1
    out = torch.empty((bs, 2 * num_steps), dtype=torch.int64, device=parents.device)
    if bs > 0 and num_steps > 0:
        _path_ranks_kernel[(bs,)](
            parents.contiguous(),
            accept_index.contiguous(),
            accept_length.contiguous(),
            out,
            n,
            num_steps,
            BLOCK_N=max(16, triton.next_power_of_2(n)),
            num_warps=1,
        )
    return out
