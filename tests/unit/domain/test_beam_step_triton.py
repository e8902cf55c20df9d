"""One beam step with its ancestor slots: the Triton kernel against ``domain.tree.beam_step``
bit for bit on hypothesis' draft beams (exact ties included), every step of each beam; the
hidden states each step carries are the draft forward's own rows (distinct per branch), every
other step read through a strided view, as a forward's output slice may be."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from eagletree.domain.tree import beam_step, select_top_k_tokens
from tests.conftest import requires_triton
from tests.hypothesis_profiles import examples

from .strategies import DEVICES, DraftCase, draft_cases


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(60), deadline=None)
@given(case=draft_cases())
def test_the_triton_beam_step_equals_the_reference(device: str, case: DraftCase) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.beam_step import beam_step as triton_beam_step

    k, bs = case.topk, case.bs
    generator = torch.Generator().manual_seed(bs * 31 + k)
    first = select_top_k_tokens(
        0,
        case.step_probs[0].to(device),
        case.step_tokens[0].to(device),
        case.step_hidden[0].to(device),
        None,
        k,
    )
    scores = first.scores
    ancestors = torch.zeros((bs * k, 0), dtype=torch.int64, device=device)
    for step in range(1, case.num_steps):
        own_slots = torch.randint(1, 1000, (bs * k,), generator=generator).to(device)
        # (bs·k, H): what draft forward ``step`` returned for each branch
        hidden = case.step_hidden[step].to(device)
        if step % 2 == 0:
            hidden = torch.cat([hidden, hidden.flip(1)], dim=1)[:, : hidden.shape[1]]
        args = (
            step,
            case.step_probs[step].to(device),
            case.step_tokens[step].to(device),
            hidden,
            scores,
            ancestors,
            own_slots,
            k,
        )
        expected, expected_ancestors = beam_step(*args)
        got, got_ancestors = triton_beam_step(*args)
        assert torch.equal(got.input_ids, expected.input_ids)
        assert torch.equal(got.hidden_states, expected.hidden_states)
        assert torch.equal(got.scores, expected.scores)
        for a, b in zip(got.tree_info, expected.tree_info, strict=True):
            assert a.shape == b.shape and torch.equal(a, b)
        assert torch.equal(got_ancestors, expected_ancestors)
        assert got_ancestors.shape == (bs * k, step)
        scores, ancestors = expected.scores, expected_ancestors
