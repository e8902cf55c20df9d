"""Reference semantics of compaction: the accepted path moved to the front of each request block.

After verification the accepted nodes of request b sit at scattered node rows (e.g. 0, 2, 5) of
its N-row block, and their target KV at scattered slots of its verify window. Everything after
verification (the scheduler's token stride, the draft-extend rows, the next verify's prefix)
expects a chain, so the path is moved to rows / slots ``[0, accept_length]`` of the block.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def accepted_move_plan(
    accept_index: torch.Tensor,
    accept_length: torch.Tensor,
    verify_slots: torch.Tensor,
    num_draft_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tgt, src) slot pairs that put the accepted path's KV at the front of each verify window.

    ``accept_index`` (bs, S+1) global node ids (−1 padded), ``accept_length`` (bs,),
    ``verify_slots`` (bs·N,) the verify forward's ``out_cache_loc`` (chain order). Returns two
    (bs·(S+1),) int64 tensors; pair ``b·(S+1) + t`` moves accepted node t of request b. Pairs
    beyond the path, and pairs whose node already sits in place (tgt == src: the root always,
    the whole path when the top-ranked chain wins), are (0, 0) padding, so a mover copies only
    the side-branch suffix. Within a request a target never lies after its source (node index
    ``a_t >= t``), and ``move_rows_reference`` reads every source before any write.
    """
    bs, width = accept_index.shape
    n = num_draft_tokens
    device = accept_index.device
    step = torch.arange(width, device=device)
    block = torch.arange(bs, device=device).unsqueeze(1) * n
    on_path = step.unsqueeze(0) <= accept_length.unsqueeze(1).long()  # (bs, S+1)
    slots = verify_slots.long()
    tgt = slots[block + step.clamp(max=n - 1).unsqueeze(0)]  # (bs, S+1)
    src = slots[accept_index.long().clamp(min=0)]
    moving = on_path & (tgt != src)
    return torch.where(moving, tgt, 0).flatten(), torch.where(moving, src, 0).flatten()


def compact_to_front(
    x: torch.Tensor, accept_index: torch.Tensor, num_draft_tokens: int, *, inplace: bool = False
) -> torch.Tensor:
    """Copy of node-indexed ``x`` (bs·N, …) whose rows ``b·N + t`` hold ``x[accept_index[b, t]]``.

    Rows past a request's path keep their own content (never read downstream). With
    ``inplace=True`` the S+1 path rows per request are gathered first and written back into
    ``x`` itself, which avoids copying all bs·N rows (the hidden states are the large case).
    """
    src, dst = path_and_front_rows(accept_index, num_draft_tokens)
    path_rows = x[src]  # gathered before any write: sources and targets overlap
    out = x if inplace else x.clone()
    out[dst] = path_rows
    return out


def path_and_front_rows(
    accept_index: torch.Tensor, num_draft_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``src[i]`` of a node-indexed tensor goes to row ``dst[i]`` → two (bs·R,) int64,
    R = min(S+1, N): the path's nodes to the front of each N-row block (past a path a row maps
    to itself)."""
    bs, width = accept_index.shape
    n = num_draft_tokens
    rows = min(width, n)  # a path never has more nodes than the tree
    step = torch.arange(rows, device=accept_index.device)
    dst = torch.arange(bs, device=accept_index.device).unsqueeze(1) * n + step  # (bs, rows)
    path = accept_index[:, :rows].long()
    return torch.where(path >= 0, path, dst).flatten(), dst.flatten()


def bonus_tokens(
    predict: torch.Tensor, accept_index: torch.Tensor, accept_length: torch.Tensor
) -> torch.Tensor:
    """The target's token after each request's last accepted node → (bs,), predict's dtype."""
    last_node = torch.gather(accept_index.long(), 1, accept_length.long().unsqueeze(1))
    return predict[last_node.squeeze(1)]


class CompactionPlan(NamedTuple):
    """Everything compaction needs, computed once per step from the verify result.

    ``tgt``, ``src`` (bs·(S+1),) int64: ``accepted_move_plan``'s KV slot pairs. ``path_rows``,
    ``front_rows`` (bs·R,) int64 with R = min(S+1, N): node row ``path_rows[i]`` goes to row
    ``front_rows[i]`` (``compact_to_front``'s gather and scatter indices; past a path a row maps
    to itself).
    """

    tgt: torch.Tensor
    src: torch.Tensor
    path_rows: torch.Tensor
    front_rows: torch.Tensor


def compaction_plan(
    accept_index: torch.Tensor,
    accept_length: torch.Tensor,
    verify_slots: torch.Tensor,
    num_draft_tokens: int,
) -> CompactionPlan:
    """The KV move plan and the row compaction indices of a verify result (see above)."""
    tgt, src = accepted_move_plan(accept_index, accept_length, verify_slots, num_draft_tokens)
    return CompactionPlan(tgt, src, *path_and_front_rows(accept_index, num_draft_tokens))


def compact_rows(x: torch.Tensor, plan: CompactionPlan) -> torch.Tensor:
    """``compact_to_front(x, …, inplace=True)`` with the plan's indices: two kernels."""
    path_rows = x.index_select(0, plan.path_rows)  # gathered before any write
    return x.index_copy_(0, plan.front_rows, path_rows)
