"""Reference semantics of tree verification: greedy and target-only sampling → ``VerifyResult``.

Both walks start at the root, and at each depth scan the children of the last accepted node in
the order the links give (``retrieve_next_token`` then ``retrieve_next_sibling``). They are
vectorised over the batch with a loop over depth; the link structure is first turned into
"parent" and "position in the sibling list" tensors by pointer doubling, so that any sibling
order the links encode is honoured, not only the increasing order ``build_tree`` produces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagletree.domain.sampling import sample_from_probs


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The outcome of verifying one tree per request."""

    predict: torch.Tensor  # (bs·N,) int32: next token at every accepted node, −1 elsewhere
    accept_index: torch.Tensor  # (bs, S+1) int32 global node ids of the path, root first, −1 pad
    accept_length: torch.Tensor  # (bs,) int32 accepted drafts; emitted tokens = this + 1


def sibling_structure(
    retrieve_next_token: torch.Tensor, retrieve_next_sibling: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Parent of every node (−1 if none) and its distance to the end of its sibling list.

    A larger distance means earlier in sibling order. Both (bs, N) int64; O(log N) gathers.
    """
    bs, n = retrieve_next_sibling.shape
    device = retrieve_next_sibling.device
    node = torch.arange(n, dtype=torch.int64, device=device).expand(bs, n)
    has_next = retrieve_next_sibling >= 0
    # list ranking: pointer to the tail of the node's sibling list and the hops to reach it
    tail = torch.where(has_next, retrieve_next_sibling.long(), node)
    hops = has_next.long()
    for _ in range(max(1, (n - 1).bit_length())):
        hops = hops + torch.gather(hops, 1, tail)
        tail = torch.gather(tail, 1, tail)
    # a list's parent is the node whose first child is the list's head; key lists by their tail
    has_child = retrieve_next_token >= 0
    head_tail = torch.gather(tail, 1, retrieve_next_token.long().clamp(min=0))
    slot = torch.where(has_child, head_tail, torch.full_like(head_tail, n))
    parent_of_tail = torch.full((bs, n + 1), -1, dtype=torch.int64, device=device)
    parent_of_tail.scatter_(1, slot, torch.where(has_child, node, -1))
    parent = torch.gather(parent_of_tail[:, :n], 1, tail)
    return parent, hops


def _earliest(candidate: torch.Tensor, hops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Among flagged nodes (bs, N) the earliest in sibling order → (found (bs,), node (bs,))."""
    key = torch.where(candidate, hops, torch.full_like(hops, -1))
    best_key, best = key.max(dim=1)
    return best_key >= 0, best


def verify_tree_greedy(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    num_steps: int,
) -> VerifyResult:
    """Accept, depth by depth, the first child whose token equals the target's argmax there."""
    # candidates, target_predict, retrieve_*: (bs, N)
    bs, n = candidates.shape
    device = candidates.device
    parent, hops = sibling_structure(retrieve_next_token, retrieve_next_sibling)
    last = torch.zeros(bs, dtype=torch.int64, device=device)
    accepted = torch.zeros((bs, n), dtype=torch.bool, device=device)
    accepted[:, 0] = True
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_index[:, 0] = retrieve_index[:, 0].to(torch.int32)
    for depth in range(1, num_steps + 1):
        wanted = torch.gather(target_predict, 1, last.unsqueeze(1))  # (bs, 1)
        match = (parent == last.unsqueeze(1)) & (candidates == wanted)
        found, best = _earliest(match, hops)
        accept_index[:, depth] = torch.where(
            found, torch.gather(retrieve_index, 1, best.unsqueeze(1)).squeeze(1), -1
        ).to(torch.int32)
        accepted |= found.unsqueeze(1) & (torch.arange(n, device=device) == best.unsqueeze(1))
        last = torch.where(found, best, last)
    accept_length = (accept_index[:, 1:] >= 0).sum(dim=1).to(torch.int32)
    node_predict = torch.where(accepted, target_predict.long(), -1)
    predict = _scatter_nodes(node_predict, retrieve_index)
    return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)


def verify_tree_sampling(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_probs: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    num_steps: int,
) -> VerifyResult:
    """Target-only tree sampling: lossless, the emitted tokens follow the target distribution.

    ``target_probs`` (bs·N, V) or (bs, N, V): the target's distribution after each node, with
    temperature / top-k / top-p already applied (``domain.sampling.probs_from_logits``).
    ``coins`` (bs, N) uniform in [0, 1): the coin of the walk at each node. ``final_coins``
    (bs,): the coin that samples the bonus. At each depth the coin at the last accepted node
    walks its children in sibling order, accumulating their target probability, and accepts
    the first child whose cumulative probability exceeds the coin. If none does, the bonus is
    drawn from the target with the drafted children removed (renormalised); after S accepted
    drafts it is drawn from the full target distribution. Precondition: siblings carry
    distinct tokens (true for EAGLE trees, whose children come from one top-k).
    """
    bs, n = candidates.shape
    device = candidates.device
    probs = target_probs.reshape(bs, n, target_probs.shape[-1])  # (bs, N, V)
    vocab = probs.shape[2]
    parent, hops = sibling_structure(retrieve_next_token, retrieve_next_sibling)
    tokens = candidates.long().clamp(min=0)
    last = torch.zeros(bs, dtype=torch.int64, device=device)
    active = torch.ones(bs, dtype=torch.bool, device=device)
    node_predict = torch.full((bs, n), -1, dtype=torch.int64, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_index[:, 0] = retrieve_index[:, 0].to(torch.int32)
    # earlier_or_same[b, i, j]: child i comes no later than child j in sibling order
    earlier_or_same = hops.unsqueeze(2) >= hops.unsqueeze(1)
    for depth in range(1, num_steps + 1):
        row = _row_at(probs, last)  # (bs, V)
        child = (parent == last.unsqueeze(1)) & active.unsqueeze(1)
        child_p = torch.gather(row, 1, tokens) * child  # (bs, N)
        cumulative = (child_p.unsqueeze(2) * earlier_or_same).sum(dim=1)  # (bs, N)
        coin = torch.gather(coins, 1, last.unsqueeze(1))  # (bs, 1)
        found, best = _earliest(child & (coin < cumulative), hops)
        chosen_token = torch.gather(tokens, 1, best.unsqueeze(1))
        current = torch.gather(node_predict, 1, last.unsqueeze(1))
        next_token = torch.where(found.unsqueeze(1), chosen_token, current)
        node_predict.scatter_(1, last.unsqueeze(1), next_token)
        accept_index[:, depth] = torch.where(
            found, torch.gather(retrieve_index, 1, best.unsqueeze(1)).squeeze(1), -1
        ).to(torch.int32)
        active = active & found
        last = torch.where(found, best, last)
    # bonus: after a rejection, from the target without the drafted children of the last node
    row = _row_at(probs, last)
    drafted = (parent == last.unsqueeze(1)) & ~active.unsqueeze(1)  # (bs, N)
    removed = torch.zeros((bs, vocab + 1), dtype=row.dtype, device=device)
    removed.scatter_(1, torch.where(drafted, tokens, vocab), 1.0)
    residual = row * (1.0 - removed[:, :vocab])
    usable = residual.sum(dim=1, keepdim=True) > 0
    bonus = sample_from_probs(torch.where(usable, residual, row), final_coins)
    node_predict.scatter_(1, last.unsqueeze(1), bonus.unsqueeze(1))
    accept_length = (accept_index[:, 1:] >= 0).sum(dim=1).to(torch.int32)
    predict = _scatter_nodes(node_predict, retrieve_index)
    return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)


def _row_at(probs: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """``probs[b, node[b]]`` for every request → (bs, V)."""
    index = node.view(-1, 1, 1).expand(-1, 1, probs.shape[2])
    return torch.gather(probs, 1, index).squeeze(1)


def _scatter_nodes(node_values: torch.Tensor, retrieve_index: torch.Tensor) -> torch.Tensor:
    """Place per-node values (bs, N) at their global node ids → (bs·N,) int32."""
    flat = torch.full((node_values.numel(),), -1, dtype=torch.int32, device=node_values.device)
    flat.scatter_(0, retrieve_index.flatten().long(), node_values.flatten().to(torch.int32))
    return flat
