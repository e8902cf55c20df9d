"""The tree's edges: an empty batch gives empty tensors of the right trailing
dimensions, a later beam step without branch scores is rejected, and a DraftTree is
frozen."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.tree import (
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)

from ..strategies import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", list(TreeMaskMode))
def test_an_empty_batch_gives_empty_tensors_with_the_right_trailing_dims(
    device: str, mode: TreeMaskMode
) -> None:
    k, steps, n, hidden = 4, 3, 8, 5
    empty_p = torch.empty((0, k), device=device)
    empty_i = torch.empty((0, k), dtype=torch.int64, device=device)
    first = select_top_k_tokens(
        0, empty_p, empty_i, torch.empty((0, hidden), device=device), None, k
    )
    assert first.input_ids.shape == (0,)
    assert first.hidden_states.shape == (0, hidden)
    assert first.scores.shape == (0, k)
    assert [tuple(t.shape) for t in first.tree_info] == [(0, 1, k), (0, k), (0, k + 1)]
    later = select_top_k_tokens(
        1, empty_p, empty_i, torch.empty((0, hidden), device=device), first.scores, k
    )
    assert later.input_ids.shape == (0,)
    assert later.hidden_states.shape == (0, hidden)
    assert later.scores.shape == (0, k)
    assert [tuple(t.shape) for t in later.tree_info] == [(0, k, k), (0, k * k), (0, k)]
    infos = [first.tree_info, later.tree_info, later.tree_info]
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        [i[0] for i in infos], [i[1] for i in infos], [i[2] for i in infos], n
    )
    assert parent_list.shape == (0, (steps - 1) * k + 1)
    assert top_scores_index.shape == (0, n - 1)
    assert draft_tokens.shape == (0, n - 1)
    empty = torch.empty(0, dtype=torch.int64, device=device)
    tree = build_tree(empty, parent_list, top_scores_index, draft_tokens, empty, k, steps, n, mode)
    assert tree.tree_mask.shape == (0,) and tree.tree_mask.dtype == torch.bool
    assert tree.positions.shape == (0,)
    assert tree.draft_tokens.shape == (0,)
    for t in (
        tree.retrieve_index,
        tree.retrieve_next_token,
        tree.retrieve_next_sibling,
        tree.parents,
    ):
        assert t.shape == (0, n)


def test_a_later_beam_step_without_branch_scores_is_rejected() -> None:
    p = torch.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="scores"):
        select_top_k_tokens(
            1, p, torch.zeros((2, 2), dtype=torch.int64), torch.zeros(2, 3), None, 2
        )


def test_draft_tree_is_frozen() -> None:
    tree = build_tree(
        torch.tensor([1]),
        torch.empty((1, 0), dtype=torch.int64),
        torch.tensor([[0]]),
        torch.tensor([[2]]),
        torch.tensor([0]),
        1,
        1,
        2,
    )
    assert tree.mask_mode is TreeMaskMode.FULL_MASK
    with pytest.raises(AttributeError):
        tree.positions = torch.zeros(2)  # type: ignore[misc]
