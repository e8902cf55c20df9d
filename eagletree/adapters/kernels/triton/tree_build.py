"""Triton: the verify tree of every request in one launch (``domain.tree.build_tree``, QLEN_ONLY).

The reference takes about 80 small torch kernels (parents by ``searchsorted``, an ancestor
matrix by S gathers, child links by N × N reductions, the mask, positions). One program per
request does it all on its N nodes: parent of node i ≥ 1 from its candidate's flat id, then
ancestors by S parent hops (each hop one load of the parents this program just stored), depth,
first-child and next-sibling links, and the N × N mask. Integer and boolean outputs equal the
reference's bit for bit; FULL_MASK trees stay on the reference (their size depends on Σ L_b).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.domain.tree import DraftTree, TreeMaskMode
from eagletree.domain.tree import build_tree as reference_build_tree


@triton.jit
def _build_tree_kernel(
    verified_ptr,  # (bs,) root tokens
    parent_list_ptr,  # (bs, P) flat ids of the parents of each step's candidates
    top_scores_ptr,  # (bs, N − 1) chosen candidates' flat ids, sorted
    draft_tokens_ptr,  # (bs, N − 1)
    seq_lens_ptr,  # (bs,)
    parents_ptr,  # (bs, N) int64 out
    positions_ptr,  # (bs·N,) int64 out
    retrieve_index_ptr,  # (bs, N) int64 out
    next_token_ptr,  # (bs, N) int64 out
    next_sibling_ptr,  # (bs, N) int64 out
    tokens_ptr,  # (bs·N,) int64 out
    mask_ptr,  # (bs·N·N,) bool out, as uint8
    n,
    num_parents,
    max_depth,
    TOPK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, BLOCK_N)
    valid = node < n
    is_candidate = valid & (node >= 1)
    cand = tl.load(top_scores_ptr + req * (n - 1) + node - 1, mask=is_candidate, other=0).to(
        tl.int64
    )
    # parent of node i ≥ 1: the root when its flat id is a depth-1 candidate (slot 0), else the
    # node holding flat id parent_list[slot] (its index in the sorted selection, plus one)
    slot = cand // TOPK
    if TOPK == 1:
        parent = node.to(tl.int64) - 1
    else:
        parent_flat = tl.load(
            parent_list_ptr + req * num_parents + tl.minimum(slot, num_parents - 1),
            mask=is_candidate & (slot > 0) & (num_parents > 0),
            other=-1,
        ).to(tl.int64)
        # rank of parent_flat among the selection = how many chosen flat ids lie below it
        below = (cand[None, :] < parent_flat[:, None]) & is_candidate[None, :]
        parent = tl.where(slot > 0, 1 + tl.sum(below.to(tl.int64), axis=1), 0)
        parent = tl.where(is_candidate, parent, -1)
    parent = tl.where(node == 0, -1, parent)
    row = req * n + node
    tl.store(parents_ptr + row, parent, mask=valid)
    tl.debug_barrier()  # the hops below read the parents every thread of the program stored

    # ancestors[i, j]: j is i or one of its ancestors; S hops reach the root from any depth
    col = tl.arange(0, BLOCK_N)
    current = node.to(tl.int64)
    ancestors = col[None, :] == current[:, None]
    for _ in range(max_depth):
        up = tl.load(parents_ptr + req * n + tl.maximum(current, 0), mask=valid, other=-1)
        current = tl.where(current > 0, up, current)
        ancestors = ancestors | ((col[None, :] == current[:, None]) & (current[:, None] >= 0))
    ancestors = ancestors & valid[:, None] & (col[None, :] < n)
    depth = tl.sum(ancestors.to(tl.int64), axis=1) - 1
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int64)
    tl.store(positions_ptr + row, seq_len + depth, mask=valid)
    tl.store(retrieve_index_ptr + row, row, mask=valid)

    # first child: the smallest j whose parent is i; next sibling: the smallest j > i with i's
    # parent (the root has none)
    parent_row = tl.load(parents_ptr + req * n + col, mask=col < n, other=-2)
    is_child = (parent_row[None, :] == node[:, None]) & (col[None, :] < n)
    first = tl.min(tl.where(is_child, col[None, :], BLOCK_N), axis=1)
    sibling = (
        (parent_row[None, :] == parent[:, None])
        & (col[None, :] > node[:, None])
        & (parent[:, None] >= 0)
        & (col[None, :] < n)
    )
    following = tl.min(tl.where(sibling, col[None, :], BLOCK_N), axis=1)
    tl.store(next_token_ptr + row, tl.where(first == BLOCK_N, -1, first).to(tl.int64), mask=valid)
    tl.store(
        next_sibling_ptr + row,
        tl.where(following == BLOCK_N, -1, following).to(tl.int64),
        mask=valid,
    )

    root = tl.load(verified_ptr + req).to(tl.int64)
    drafted = tl.load(draft_tokens_ptr + req * (n - 1) + node - 1, mask=is_candidate, other=0).to(
        tl.int64
    )
    tl.store(tokens_ptr + row, tl.where(node == 0, root, drafted), mask=valid)
    mask_offsets = req * n * n + node[:, None] * n + col[None, :]
    tl.store(
        mask_ptr + mask_offsets,
        ancestors.to(tl.uint8),
        mask=valid[:, None] & (col[None, :] < n),
    )


def build_tree(
    verified_id: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    num_draft_tokens: int,
    mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
    *,
    seq_lens_sum: int | None = None,
) -> DraftTree:
    """``domain.tree.build_tree`` with the same arguments; one launch for QLEN_ONLY trees."""
    if mask_mode is not TreeMaskMode.QLEN_ONLY:
        return reference_build_tree(
            verified_id, parent_list, top_scores_index, draft_tokens, seq_lens, topk,
            num_steps, num_draft_tokens, mask_mode, seq_lens_sum=seq_lens_sum,
        )  # fmt: skip
    n, bs = num_draft_tokens, verified_id.shape[0]
    device = verified_id.device

    def out(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.int64, device=device)

    parents, retrieve_index = out(bs, n), out(bs, n)
    next_token, next_sibling = out(bs, n), out(bs, n)
    positions, tokens = out(bs * n), out(bs * n)
    tree_mask = torch.empty(bs * n * n, dtype=torch.bool, device=device)
    if bs > 0:
        _build_tree_kernel[(bs,)](
            verified_id.contiguous(),
            parent_list.contiguous() if parent_list.numel() else top_scores_index,
            top_scores_index.contiguous(),
            draft_tokens.contiguous(),
            seq_lens.contiguous(),
            parents,
            positions,
            retrieve_index,
            next_token,
            next_sibling,
            tokens,
            tree_mask.view(torch.uint8),
            n,
            parent_list.shape[1],
            min(num_steps, n - 1),
            TOPK=topk,
            BLOCK_N=max(16, triton.next_power_of_2(n)),
            num_warps=4,
        )
    return DraftTree(
        tree_mask=tree_mask,
        positions=positions,
        retrieve_index=retrieve_index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        draft_tokens=tokens,
        parents=parents,
        selected=top_scores_index,
        mask_mode=mask_mode,
    )
