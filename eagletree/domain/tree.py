"""Reference semantics of EAGLE tree drafting: the beam step, the node selection, the tree tensors.

The semantics are SGLang's (``select_top_k_tokens``, ``organize_draft_results``,
``build_tree_kernel_efficient``), with one policy made explicit: score ties are broken towards
the lower flat candidate id, which keeps every selection ancestor-closed (a child's cumulative
score never exceeds its parent's, and a parent's flat id is always lower than its children's).

Flat candidate ids of one request: ids ``[0, k)`` are the depth-1 candidates; draft step i >= 1
contributes ``k²`` candidates at ``k + k²(i−1) + p·k + c`` (beam branch p, child c). A candidate
with flat id s has its parent's flat id at ``parent_list[s // k]`` (−1 = the root).

Everything is vectorised over the batch, fixed-shape for given (bs, k, S, N) and free of host
synchronisation, except the FULL_MASK size, which needs ``Σ L_b`` on the host (pass
``seq_lens_sum`` to avoid the sync).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

import torch


class TreeMaskMode(enum.Enum):
    """Layout of the verify attention mask produced by ``build_tree``."""

    FULL_MASK = "full_mask"  # per request N rows × (L_b + N) columns, requests concatenated
    QLEN_ONLY = "qlen_only"  # per request the N × N tree part only (the prefix is all true)


TreeInfo = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class BeamStep(NamedTuple):
    """One EAGLE beam step: the next draft forward's inputs and what the tree must remember."""

    input_ids: torch.Tensor  # (bs·k,) tokens of the k surviving branches
    hidden_states: torch.Tensor  # (bs·k, H) each survivor's parent hidden state
    scores: torch.Tensor  # (bs, k) cumulative path probabilities of the survivors
    tree_info: TreeInfo  # (scores of all candidates, their tokens, parent flat ids)


@dataclass(frozen=True, slots=True)
class DraftTree:
    """The verify input: N nodes per request, node 0 the root (the last bonus token)."""

    tree_mask: torch.Tensor  # FULL_MASK: (Σ N·(L_b+N),) bool; QLEN_ONLY: (bs·N·N,) bool
    positions: torch.Tensor  # (bs·N,) int64 = L_b + depth
    retrieve_index: torch.Tensor  # (bs, N) int64 global node id b·N + i
    retrieve_next_token: torch.Tensor  # (bs, N) int64 first child (smallest index), −1 = none
    retrieve_next_sibling: torch.Tensor  # (bs, N) int64 next sibling (larger index), −1 = none
    draft_tokens: torch.Tensor  # (bs·N,) int64 token of every node
    parents: torch.Tensor  # (bs, N) int64 parent node index, −1 for the root
    # (bs, N − 1) int64 the flat candidate id of nodes 1..N − 1: a drawn tree's draw rank
    # (id % k) and the row of the beam it was drawn from (id // k: 0 the root, then by step)
    selected: torch.Tensor
    mask_mode: TreeMaskMode


def stable_topk_indices(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` largest entries of each row, ties towards the lower index."""
    # scores: (rows, n) -> (rows, count) int64, best first
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :count]


def select_top_k_tokens(
    step: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: torch.Tensor,
    scores: torch.Tensor | None,
    topk: int,
) -> BeamStep:
    """One EAGLE beam step (SGLang's ``select_top_k_tokens``).

    Step 0: ``topk_p``/``topk_index`` are (bs, k), the children of the root; ``scores`` is unused.
    Step i >= 1: they are (bs·k, k), k children of each of the k branches, and ``scores`` (bs, k)
    holds the branches' cumulative probabilities. The k best of the k² expanded paths survive.
    """
    k = topk
    if step == 0:
        # topk_p, topk_index: (bs, k); hidden_states: (bs, H)
        bs = topk_p.shape[0]
        parents = torch.arange(-1, k, dtype=torch.int64, device=topk_p.device)
        return BeamStep(
            input_ids=topk_index.flatten(),
            hidden_states=hidden_states.repeat_interleave(k, dim=0),
            scores=topk_p,
            tree_info=(topk_p.unsqueeze(1), topk_index, parents.unsqueeze(0).expand(bs, k + 1)),
        )
    # topk_p, topk_index: (bs·k, k); hidden_states: (bs·k, H); scores: (bs, k)
    if scores is None:
        raise ValueError("select_top_k_tokens: steps >= 1 need the branches' scores")
    bs = scores.shape[0]
    expand = scores.unsqueeze(2) * topk_p.view(bs, k, k)  # (bs, k, k) path probabilities
    survivors = stable_topk_indices(expand.flatten(1), k)  # (bs, k) flat index in [0, k²)
    expand_tokens = topk_index.view(bs, k * k)
    parent_branch = survivors // k  # (bs, k) which branch each survivor extends
    hidden = hidden_states.view(bs, k, hidden_states.shape[-1])
    survivor_hidden = torch.gather(
        hidden, 1, parent_branch.unsqueeze(-1).expand(bs, k, hidden.shape[-1])
    )
    return BeamStep(
        input_ids=torch.gather(expand_tokens, 1, survivors).flatten(),
        hidden_states=survivor_hidden.reshape(bs * k, hidden.shape[-1]),
        scores=torch.gather(expand.flatten(1), 1, survivors),
        tree_info=(expand, expand_tokens, survivors + (k * k * (step - 1) + k)),
    )


def organize_draft_results(
    score_list: list[torch.Tensor],
    token_list: list[torch.Tensor],
    parents_list: list[torch.Tensor],
    num_draft_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick the N−1 best candidates of all draft steps → (parent_list, top_scores_index, tokens).

    ``top_scores_index`` (bs, N−1) is sorted by flat id, so parents precede their children;
    ``parent_list`` (bs, (S−1)·k + 1) concatenates the per-step parent ids of steps 0..S−2
    ((bs, 0) when S == 1); ``draft_tokens`` (bs, N−1) are the chosen candidates' tokens.
    """
    all_scores = torch.cat([s.flatten(1) for s in score_list], dim=1)  # (bs, k + (S−1)k²)
    all_tokens = torch.cat(token_list, dim=1)  # (bs, k + (S−1)k²)
    bs = all_scores.shape[0]
    chosen = stable_topk_indices(all_scores, num_draft_tokens - 1)
    top_scores_index = torch.sort(chosen, dim=-1).values
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:
        parent_list = torch.empty((bs, 0), dtype=torch.int64, device=all_scores.device)
    draft_tokens = torch.gather(all_tokens, 1, top_scores_index)
    return parent_list, top_scores_index, draft_tokens


def tree_parents(
    parent_list: torch.Tensor, top_scores_index: torch.Tensor, topk: int
) -> torch.Tensor:
    """Parent node index of every tree node (−1 for the root) → (bs, N) int64.

    Precondition: the selection is ancestor-closed (``organize_draft_results`` guarantees it).
    """
    bs, num_candidates = top_scores_index.shape
    device = top_scores_index.device
    root = torch.full((bs, 1), -1, dtype=torch.int64, device=device)
    if topk == 1:  # a chain, whatever parent_list holds
        chain = torch.arange(num_candidates, dtype=torch.int64, device=device)
        return torch.cat([root, chain.unsqueeze(0).expand(bs, num_candidates)], dim=1)
    parent_slot = top_scores_index // topk  # (bs, N−1) index into parent_list; 0 = the root
    if parent_list.shape[1] > 0:
        safe_slot = parent_slot.clamp(max=parent_list.shape[1] - 1)
        parent_flat = torch.gather(parent_list, 1, safe_slot)
    else:
        parent_flat = torch.zeros_like(parent_slot)
    # node index of the parent = 1 + its position in the sorted selection
    parent_node = 1 + torch.searchsorted(top_scores_index.contiguous(), parent_flat.contiguous())
    parent_node = torch.where(parent_slot == 0, torch.zeros_like(parent_node), parent_node)
    return torch.cat([root, parent_node], dim=1)


def ancestor_matrix(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """(bs, N, N) bool: ``[b, i, j]`` is true when node j is node i or one of its ancestors."""
    bs, n = parents.shape
    current = torch.arange(n, device=parents.device).unsqueeze(0).expand(bs, n).contiguous()
    parent_or_root = parents.clamp(min=0)  # the root is its own parent: the walk stays there
    ancestors = torch.zeros((bs, n, n), dtype=torch.bool, device=parents.device)
    for _ in range(max_depth + 1):  # depth is at most max_depth, so max_depth hops reach the root
        ancestors.scatter_(2, current.unsqueeze(2), True)
        current = torch.gather(parent_or_root, 1, current)
    return ancestors


def child_links(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First-child and next-sibling links, children in increasing node index → (bs, N) each."""
    n = parents.shape[1]
    node = torch.arange(n, device=parents.device)
    missing = torch.full((), n, dtype=torch.int64, device=parents.device)
    # is_child[b, p, i]: node i is a child of node p
    is_child = parents.unsqueeze(1) == node.view(1, n, 1)
    first_child = torch.where(is_child, node.view(1, 1, n), missing).amin(dim=2)
    # sibling[b, i, j]: j > i shares i's parent (the root, parent −1, has no siblings)
    same_parent = parents.unsqueeze(2) == parents.unsqueeze(1)
    later = node.view(1, 1, n) > node.view(1, n, 1)
    sibling = same_parent & later & (parents >= 0).unsqueeze(2)
    next_sibling = torch.where(sibling, node.view(1, 1, n), missing).amin(dim=2)
    none = torch.full_like(first_child, -1)
    return (
        torch.where(first_child == n, none, first_child),
        torch.where(next_sibling == n, none, next_sibling),
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
    """Build the verify tree of N nodes per request (SGLang's ``build_tree_kernel_efficient``).

    ``verified_id`` (bs,) roots; ``parent_list``, ``top_scores_index``, ``draft_tokens`` from
    ``organize_draft_results``; ``seq_lens`` (bs,) committed lengths L_b. For FULL_MASK the mask
    size is ``N·Σ L_b + bs·N²``: pass ``seq_lens_sum`` when the host knows it, else it is read
    from the device (one sync).
    """
    n = num_draft_tokens
    bs = verified_id.shape[0]
    device = verified_id.device
    parents = tree_parents(parent_list, top_scores_index, topk)  # (bs, N)
    ancestors = ancestor_matrix(parents, max_depth=min(num_steps, n - 1))  # (bs, N, N)
    depth = ancestors.sum(dim=2) - 1  # (bs, N)
    lens = seq_lens.to(torch.int64)
    positions = (lens.unsqueeze(1) + depth).flatten()
    node = torch.arange(n, dtype=torch.int64, device=device)
    retrieve_index = node.unsqueeze(0) + n * torch.arange(bs, device=device).unsqueeze(1)
    next_token, next_sibling = child_links(parents)
    tokens = torch.cat([verified_id.to(torch.int64).unsqueeze(1), draft_tokens.long()], dim=1)

    if mask_mode is TreeMaskMode.QLEN_ONLY:
        tree_mask = ancestors.flatten()
    else:
        if seq_lens_sum is None:
            seq_lens_sum = int(lens.sum())  # SYNC: FULL_MASK's size depends on Σ L_b
        row_len = lens + n  # (bs,)
        block_start = torch.cumsum(n * row_len, dim=0) - n * row_len  # (bs,)
        # flat position of (b, row i, draft column j) = start_b + i·(L_b+N) + L_b + j
        columns = (
            block_start.view(bs, 1, 1)
            + node.view(1, n, 1) * row_len.view(bs, 1, 1)
            + lens.view(bs, 1, 1)
            + node.view(1, 1, n)
        )
        tree_mask = torch.ones(n * seq_lens_sum + bs * n * n, dtype=torch.bool, device=device)
        tree_mask[columns.flatten()] = ancestors.flatten()

    return DraftTree(
        tree_mask=tree_mask,
        positions=positions,
        retrieve_index=retrieve_index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        draft_tokens=tokens.flatten(),
        parents=parents,
        selected=top_scores_index,
        mask_mode=mask_mode,
    )


def beam_step(
    step: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: torch.Tensor,
    scores: torch.Tensor,
    ancestors: torch.Tensor,
    own_slots: torch.Tensor,
    topk: int,
) -> tuple[BeamStep, torch.Tensor]:
    """Beam step ``step >= 1`` and every survivor's ancestor slots → (beam, (bs·k, step)).

    ``select_top_k_tokens``, then each survivor's parent branch's ancestor slots followed by
    that parent's slot ``own_slots`` (the draft KV slot it wrote in the forward just run).
    """
    # topk_p, topk_index: (bs·k, k); scores: (bs, k); ancestors: (bs·k, step − 1)
    beam = select_top_k_tokens(step, topk_p, topk_index, hidden_states, scores, topk)
    bs = scores.shape[0]
    return beam, survivor_ancestors(beam, ancestors, own_slots, bs, topk, step)


def survivor_ancestors(
    beam: BeamStep,
    ancestors: torch.Tensor,
    own_slots: torch.Tensor,
    bs: int,
    k: int,
    step: int,
) -> torch.Tensor:
    """Ancestor slots of each new survivor: its parent branch's ancestors, then the parent's
    own slot of the forward just run → (bs·k, step) int64."""
    # tree_info[2] holds the survivors' flat candidate ids k + k²(step − 1) + parent·k + child
    survivor = beam.tree_info[2] - (k * k * (step - 1) + k)  # (bs, k) in [0, k²)
    parent_branch = survivor // k
    paths = torch.cat(
        [ancestors.view(bs, k, step - 1), own_slots.view(bs, k, 1)], dim=2
    )  # (bs, k, step): every branch's path slots before re-ranking
    index = parent_branch.unsqueeze(2).expand(bs, k, step)
    return torch.gather(paths, 1, index).reshape(bs * k, step)
