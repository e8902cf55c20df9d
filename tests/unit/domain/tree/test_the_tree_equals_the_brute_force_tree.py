"""The tree tensors of ``build_tree``: ancestor-closed and topological, consistent
with one another, and equal to the brute-force tree in both mask modes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from eagletree.domain.tree import TreeMaskMode

from ..brute_force.beam import beam_reference
from ..brute_force.tree import ancestors_or_self, tree_reference
from ..strategies import DEVICES, DraftCase, draft_cases
from .beam_runs import PROPERTY, organize, reference_of, run_beam, tree_of


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(case=draft_cases())
def test_tree_is_ancestor_closed_topological_and_its_tensors_are_consistent(
    device: str, case: DraftCase
) -> None:
    n, k = case.num_draft_tokens, case.topk
    _, top_scores_index, _ = organize(case, run_beam(case, device))
    beam = beam_reference(
        [p.tolist() for p in case.step_probs], [t.tolist() for t in case.step_tokens], case.bs, k
    )
    for b, selection in enumerate(top_scores_index.tolist()):
        chosen = set(selection)
        assert all(beam.parent[b][c] == -1 or beam.parent[b][c] in chosen for c in selection)
    full = tree_of(case, device, TreeMaskMode.FULL_MASK)
    qlen = tree_of(case, device, TreeMaskMode.QLEN_ONLY)
    parents = full.parents.tolist()
    lens = case.seq_lens.tolist()
    next_token, next_sibling = (
        full.retrieve_next_token.tolist(),
        full.retrieve_next_sibling.tolist(),
    )
    full_mask, qlen_mask = full.tree_mask.tolist(), qlen.tree_mask.tolist()
    assert full.tree_mask.dtype == torch.bool and qlen.tree_mask.dtype == torch.bool
    assert len(full_mask) == sum(n * (length + n) for length in lens)
    assert len(qlen_mask) == case.bs * n * n
    assert qlen.parents.tolist() == parents
    offset = 0
    for b in range(case.bs):
        assert parents[b][0] == -1
        assert all(0 <= parents[b][i] < i for i in range(1, n))
        assert full.retrieve_index[b].tolist() == [b * n + i for i in range(n)]
        assert full.draft_tokens[b * n].item() == case.verified_id[b].item()
        length = lens[b]
        for i in range(n):
            chain = ancestors_or_self(parents[b], i)
            assert full.positions[b * n + i].item() == length + len(chain) - 1
            row = full_mask[offset + i * (length + n) : offset + (i + 1) * (length + n)]
            assert row == [True] * length + [j in chain for j in range(n)]
            assert qlen_mask[(b * n + i) * n : (b * n + i + 1) * n] == row[length:]
            children, cur = [], next_token[b][i]
            while cur != -1:
                children.append(cur)
                cur = next_sibling[b][cur]
            assert children == [j for j in range(n) if parents[b][j] == i]
        assert next_sibling[b][0] == -1
        offset += n * (length + n)


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(case=draft_cases())
def test_tree_equals_the_brute_force_tree_in_both_mask_modes(device: str, case: DraftCase) -> None:
    selections, parents = reference_of(case)
    beam_tokens = beam_reference(
        [p.tolist() for p in case.step_probs],
        [t.tolist() for t in case.step_tokens],
        case.bs,
        case.topk,
    ).tokens
    roots: list[int] = case.verified_id.tolist()
    tokens = [[roots[b], *(beam_tokens[b][c] for c in selections[b])] for b in range(case.bs)]
    ref = tree_reference(parents, tokens, case.seq_lens.tolist())
    n = case.num_draft_tokens
    for mode, expected_mask in (
        (TreeMaskMode.FULL_MASK, ref.full_mask),
        (TreeMaskMode.QLEN_ONLY, ref.qlen_mask),
    ):
        tree = tree_of(case, device, mode)
        assert tree.mask_mode is mode
        assert tree.tree_mask.tolist() == expected_mask
        assert tree.parents.tolist() == ref.parents
        assert tree.positions.tolist() == ref.positions
        assert tree.retrieve_index.tolist() == ref.retrieve_index
        assert tree.retrieve_next_token.tolist() == ref.next_token
        assert tree.retrieve_next_sibling.tolist() == ref.next_sibling
        assert tree.draft_tokens.tolist() == ref.draft_tokens
        for t in (tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling):
            assert tuple(t.shape) == (case.bs, n)
    # without seq_lens_sum the mask size is read from the device: same result
    synced = tree_of(case, device, TreeMaskMode.FULL_MASK, pass_sum=False)
    assert synced.tree_mask.tolist() == ref.full_mask
