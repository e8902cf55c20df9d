"""A drafted case run through the domain's beam, node selection and tree builder, and
the brute force's selection and node parents of the same case (also used by
test_tree_build_triton.py)."""

from __future__ import annotations

import torch
from hypothesis import settings

from eagletree.domain.tree import (
    BeamStep,
    DraftTree,
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from tests.hypothesis_profiles import examples

from ..brute_force.beam import beam_reference, select_candidates
from ..brute_force.tree import node_parents_from_beam
from ..strategies import DraftCase

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
