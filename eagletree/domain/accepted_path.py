"""Domain: what a verify step's accepted path says about the draft — the rank of the candidate
the target took at each depth, and how many candidates the tree offered there.

Within a parent, the candidates EAGLE keeps are a prefix of the draft's ranking (a child's path
score falls with its rank, and the selection keeps the best), and their node indices grow with
the rank. So a node's rank is the number of its earlier siblings, and the candidates offered
under a node are its children. These are the observations ``AcceptanceProfile`` learns from.
Fixed-shape and free of host synchronisation, so a captured step can compute them.
"""

from __future__ import annotations

import torch


def accepted_path_ranks(
    parents: torch.Tensor, accept_index: torch.Tensor, accept_length: torch.Tensor
) -> torch.Tensor:
    """Per request and draft depth d + 1 (d < S): the rank of the accepted node (−1 past the
    accepted drafts) and the number of candidates offered under the path's depth-d node (0 past
    the depth the path ended at, where a miss still counts as an offer).

    ``parents`` (bs, N) int64 node → parent node (−1: the root); ``accept_index`` (bs, S + 1)
    int32 global node ids of the path, root first, −1 padded; ``accept_length`` (bs,) int32.
    Returns (bs, 2·S) int64: the S ranks, then the S offers (the columns a step hands its
    policy).
    """
    bs, n = parents.shape
    num_steps = accept_index.shape[1] - 1
    node = torch.arange(n, device=parents.device)
    siblings = parents.unsqueeze(2) == parents.unsqueeze(1)  # (bs, N, N) same parent
    rank = (siblings & (node.view(1, 1, n) < node.view(1, n, 1))).sum(-1)  # (bs, N)
    children = (parents.unsqueeze(1) == node.view(1, n, 1)).sum(-1)  # (bs, N)
    first = (torch.arange(bs, device=parents.device) * n).unsqueeze(1)
    local = (accept_index.to(torch.int64) - first).clamp(min=0)  # (bs, S + 1), padding → root
    depth = torch.arange(num_steps, device=parents.device).unsqueeze(0)  # (1, S)
    accepted = accept_length.to(torch.int64).unsqueeze(1)  # (bs, 1)
    ranks = torch.where(depth < accepted, rank.gather(1, local[:, 1:]), -1)
    offered = torch.where(depth <= accepted, children.gather(1, local[:, :-1]), 0)
    return torch.cat([ranks, offered], dim=1)


def chain_path_ranks(accept_length: int, num_steps: int) -> list[int]:
    """``accepted_path_ranks``'s row for a chain of ``num_steps`` drafts of which the first
    ``accept_length`` were accepted, from that length alone (host only): every node of a chain
    is its parent's only child, so each accepted draft has rank 0 and each depth the path
    reached (the one it missed at included) offered one candidate."""
    reached = min(accept_length + 1, num_steps)
    ranks = [0] * accept_length + [-1] * (num_steps - accept_length)
    return ranks + [1] * reached + [0] * (num_steps - reached)
