"""Tests of the tree reference semantics: the beam, the node selection and the tree tensors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from eagletree.domain.tree import (
    BeamStep,
    DraftTree,
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from tests.hypothesis_profiles import examples

from .brute_force.beam import beam_reference, select_candidates
from .brute_force.tree import (
    ancestors_or_self,
    node_parents_from_beam,
    node_parents_from_parent_list,
    tree_reference,
)
from .strategies import DEVICES, DraftCase, draft_cases

PROPERTY = settings(max_examples=examples(200), deadline=None)


def run_beam(case: DraftCase, device: str) -> list[BeamStep]:
    steps: list[BeamStep] = []
    scores = None
    for i in range(case.num_steps):
        step = select_top_k_tokens(
            i,
            case.step_probs[i].to(device),
            case.step_tokens[i].to(device),
            case.step_hidden[i].to(device),
            scores,
            case.topk,
        )
        steps.append(step)
        scores = step.scores
    return steps


def organize(
    case: DraftCase, steps: list[BeamStep]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return organize_draft_results(
        [s.tree_info[0] for s in steps],
        [s.tree_info[1] for s in steps],
        [s.tree_info[2] for s in steps],
        case.num_draft_tokens,
    )


def tree_of(case: DraftCase, device: str, mode: TreeMaskMode, pass_sum: bool = True) -> DraftTree:
    parent_list, top_scores_index, draft_tokens = organize(case, run_beam(case, device))
    return build_tree(
        case.verified_id.to(device),
        parent_list,
        top_scores_index,
        draft_tokens,
        case.seq_lens.to(device),
        case.topk,
        case.num_steps,
        case.num_draft_tokens,
        mode,
        seq_lens_sum=int(case.seq_lens.sum()) if pass_sum else None,
    )


def reference_of(case: DraftCase) -> tuple[list[list[int]], list[list[int]]]:
    """Brute-force selection and node parents of every request."""
    beam = beam_reference(
        [p.tolist() for p in case.step_probs],
        [t.tolist() for t in case.step_tokens],
        case.bs,
        case.topk,
    )
    selections = [select_candidates(beam.scores[b], case.num_draft_tokens) for b in range(case.bs)]
    parents = [node_parents_from_beam(selections[b], beam.parent[b]) for b in range(case.bs)]
    return selections, parents


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(case=draft_cases())
def test_every_beam_step_equals_the_brute_force_beam(device: str, case: DraftCase) -> None:
    steps = run_beam(case, device)
    beam = beam_reference(
        [p.tolist() for p in case.step_probs],
        [t.tolist() for t in case.step_tokens],
        case.bs,
        case.topk,
    )
    k = case.topk
    for i, (step, ref) in enumerate(zip(steps, beam.steps, strict=True)):
        assert step.input_ids.tolist() == ref.input_ids
        assert torch.equal(step.hidden_states.cpu(), case.step_hidden[i][ref.hidden_rows])
        assert step.scores.tolist() == ref.scores
        scores, tokens, parents = step.tree_info
        expected_scores_shape = (case.bs, 1, k) if i == 0 else (case.bs, k, k)
        assert tuple(scores.shape) == expected_scores_shape
        assert scores.flatten(1).tolist() == ref.candidate_scores
        assert tokens.tolist() == ref.candidate_tokens
        assert parents.tolist() == ref.parent_ids


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(case=draft_cases())
def test_selection_is_the_n_minus_1_best_candidates_sorted_by_flat_id(
    device: str, case: DraftCase
) -> None:
    steps = run_beam(case, device)
    parent_list, top_scores_index, draft_tokens = organize(case, steps)
    beam = beam_reference(
        [p.tolist() for p in case.step_probs],
        [t.tolist() for t in case.step_tokens],
        case.bs,
        case.topk,
    )
    n, k, s = case.num_draft_tokens, case.topk, case.num_steps
    expected = [select_candidates(beam.scores[b], n) for b in range(case.bs)]
    assert top_scores_index.tolist() == expected
    assert draft_tokens.tolist() == [
        [beam.tokens[b][c] for c in expected[b]] for b in range(case.bs)
    ]
    assert tuple(parent_list.shape) == (case.bs, 0 if s == 1 else (s - 1) * k + 1)
    expected_parent_list = [
        [pid for ref in beam.steps[: s - 1] for pid in ref.parent_ids[b]] for b in range(case.bs)
    ]
    assert parent_list.tolist() == expected_parent_list
    # the parent_list rule of the spec finds every candidate's true beam parent
    for b in range(case.bs):
        for c in range(k, len(beam.scores[b])):
            assert parent_list[b, c // k].item() == beam.parent[b][c]


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_steps", [1, 2, 5])
@pytest.mark.parametrize("mode", list(TreeMaskMode))
def test_topk_one_gives_the_chain_whatever_parent_list_holds(
    device: str, num_steps: int, mode: TreeMaskMode
) -> None:
    gen = torch.Generator().manual_seed(num_steps)
    bs, n = 3, num_steps + 1
    seq_lens = torch.tensor([0, 4, 9])
    garbage_parent_list = torch.randint(-1, 50, (bs, num_steps), generator=gen)
    top_scores_index = torch.arange(n - 1).expand(bs, n - 1)
    draft_tokens = torch.randint(100, (bs, n - 1), generator=gen)
    verified = torch.randint(100, (bs,), generator=gen)
    tree = build_tree(
        verified.to(device),
        garbage_parent_list.to(device),
        top_scores_index.to(device),
        draft_tokens.to(device),
        seq_lens.to(device),
        1,
        num_steps,
        n,
        mode,
        seq_lens_sum=int(seq_lens.sum()),
    )
    chain = [-1, *range(n - 1)]
    tokens = [
        [root, *row] for root, row in zip(verified.tolist(), draft_tokens.tolist(), strict=True)
    ]
    ref = tree_reference([chain] * bs, tokens, seq_lens.tolist())
    assert node_parents_from_parent_list(list(range(n - 1)), [], 1) == chain
    assert tree.parents.tolist() == [chain] * bs
    assert tree.positions.tolist() == ref.positions
    assert tree.retrieve_next_token.tolist() == [[*range(1, n), -1]] * bs
    assert tree.retrieve_next_sibling.tolist() == [[-1] * n] * bs
    expected_mask = ref.full_mask if mode is TreeMaskMode.FULL_MASK else ref.qlen_mask
    assert tree.tree_mask.tolist() == expected_mask


@pytest.mark.parametrize("device", DEVICES)
def test_build_tree_follows_parent_list_by_the_spec_rule(device: str) -> None:
    # k = 2, S = 3: candidates 0..1 (depth 1), 2..5 (step 1), 6..9 (step 2);
    # parent_list = [-1, 0, 1, survivors of step 1]; survivors 5 (branch 1, child 1) and 2
    k, steps, n = 2, 3, 7
    parent_list = torch.tensor([[-1, 0, 1, 5, 2]])
    # 2 → parent_list[1] = 0; 5 → parent_list[2] = 1; 6 → parent_list[3] = 5; 9 → 2
    top_scores_index = torch.tensor([[0, 1, 2, 5, 6, 9]])
    expected = node_parents_from_parent_list([0, 1, 2, 5, 6, 9], [-1, 0, 1, 5, 2], k)
    assert expected == [-1, 0, 0, 1, 2, 4, 3]
    tree = build_tree(
        torch.tensor([7], device=device),
        parent_list.to(device),
        top_scores_index.to(device),
        torch.tensor([[10, 11, 12, 15, 16, 19]], device=device),
        torch.tensor([3], device=device),
        k,
        steps,
        n,
        TreeMaskMode.QLEN_ONLY,
    )
    ref = tree_reference([expected], [[7, 10, 11, 12, 15, 16, 19]], [3])
    assert tree.parents.tolist() == ref.parents
    assert tree.positions.tolist() == ref.positions == [3, 4, 4, 5, 5, 6, 6]
    assert tree.retrieve_next_token.tolist() == ref.next_token
    assert tree.retrieve_next_sibling.tolist() == ref.next_sibling
    assert tree.tree_mask.tolist() == ref.qlen_mask


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
