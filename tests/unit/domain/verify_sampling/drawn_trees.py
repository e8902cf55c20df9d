"""Test support: EAGLE trees whose children are drawn (``draw_children``) over a Markov draft,
built with the domain's own beam, selection and tree functions, and their verification."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagletree.domain.tree import (
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from eagletree.domain.tree_sampling import draw_children, verify_tree_drawn
from eagletree.domain.verify import VerifyResult


@dataclass(frozen=True)
class DrawnTree:
    candidates: torch.Tensor  # (B, N) target ids, the root first
    parents: torch.Tensor  # (B, N)
    ranks: torch.Tensor  # (B, N) draw rank, −1 for the root
    sources: torch.Tensor  # (B, N) the draft row each node was drawn from, −1 for the root
    draft_probs: torch.Tensor  # (B, 1 + (S − 1)·k, V_draft)


def tree_coins(num_steps: int, topk: int) -> int:
    """Draw coins of a tree: k at the root, k² at each later depth (by flat candidate id)."""
    return topk + (num_steps - 1) * topk * topk


def draw_tree(
    roots: torch.Tensor,
    draft: torch.Tensor,
    shape: tuple[int, int, int],
    coins: torch.Tensor,
    ids: torch.Tensor | None,
    picked: torch.Tensor | None = None,
) -> DrawnTree:
    """The tree of (S, k, N) ``shape`` under each root (B,), each node's children drawn from
    ``draft`` (V, V_draft) at its token with ``coins`` (B, tree_coins); rows flagged in
    ``picked`` (B,) take the draft's top k instead, scored by their probabilities."""
    num_steps, k, n = shape
    batch = roots.shape[0]

    def children(rows: torch.Tensor, row_coins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = draft[rows]  # (R, V_draft)
        columns, scores = draw_children(q, row_coins)
        if picked is not None:
            top_p, top_columns = torch.sort(q, dim=1, descending=True, stable=True)
            flag = picked.repeat_interleave(rows.shape[0] // batch).unsqueeze(1)
            columns = torch.where(flag, top_columns[:, :k], columns)
            scores = torch.where(flag, top_p[:, :k], scores)
        return scores, columns if ids is None else ids[columns]

    scores, tokens = children(roots, coins[:, :k])
    hidden = torch.zeros((batch, 1))
    beam = select_top_k_tokens(0, scores, tokens, hidden, None, k)
    steps, rows = [beam], [draft[roots].unsqueeze(1)]
    for step in range(1, num_steps):
        start = k + (step - 1) * k * k
        scores, tokens = children(
            beam.input_ids, coins[:, start : start + k * k].reshape(batch * k, k)
        )
        rows.append(draft[beam.input_ids].view(batch, k, -1))
        beam = select_top_k_tokens(step, scores, tokens, beam.hidden_states, beam.scores, k)
        steps.append(beam)
    parent_list, chosen, draft_tokens = organize_draft_results(
        [s.tree_info[0] for s in steps],
        [s.tree_info[1] for s in steps],
        [s.tree_info[2] for s in steps],
        n,
    )
    tree = build_tree(
        roots,
        parent_list,
        chosen,
        draft_tokens,
        torch.zeros(batch, dtype=torch.int64),
        k,
        num_steps,
        n,
        TreeMaskMode.QLEN_ONLY,
    )
    root = torch.full((batch, 1), -1, dtype=torch.int64)
    return DrawnTree(
        candidates=tree.draft_tokens.view(batch, n),
        parents=tree.parents,
        ranks=torch.cat([root, chosen % k], dim=1),
        sources=torch.cat([root, chosen // k], dim=1),
        draft_probs=torch.cat(rows, dim=1),
    )


def verify(
    tree: DrawnTree,
    target: torch.Tensor,
    drawn: torch.Tensor,
    coins: torch.Tensor,
    bonus: torch.Tensor,
    shape: tuple[int, int, int],
    ids: torch.Tensor | None,
) -> VerifyResult:
    """``verify_tree_drawn`` of ``tree`` under a Markov ``target`` (V, V)."""
    num_steps, k, _ = shape
    return verify_tree_drawn(
        tree.candidates,
        tree.parents,
        tree.ranks,
        tree.sources,
        target[tree.candidates],
        tree.draft_probs,
        drawn,
        coins,
        bonus,
        num_steps,
        k,
        ids,
    )


def emitted_tokens(result: VerifyResult) -> list[list[int]]:
    """Each request's emitted tokens: the prediction at every node of its accepted path."""
    predict = result.predict.tolist()
    out = []
    for b, length in enumerate(result.accept_length.tolist()):
        path = result.accept_index[b, : length + 1].tolist()
        out.append([predict[node] for node in path])
    return out
