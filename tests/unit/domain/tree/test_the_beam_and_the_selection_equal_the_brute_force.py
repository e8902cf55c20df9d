"""The beam and the node selection against their plain-Python references: every beam
step's survivors and tree info, and the N − 1 best candidates by flat id."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from ..brute_force.beam import beam_reference, select_candidates
from ..strategies import DEVICES, DraftCase, draft_cases
from .beam_runs import PROPERTY, organize, run_beam


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
