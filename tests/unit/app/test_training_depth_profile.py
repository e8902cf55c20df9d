"""The per-depth figures train-draft writes: the rank profile (the engine's prior) on a case
worked by hand, its shape and sums, and the offline chain drafter's rows."""

from __future__ import annotations

import pytest
import torch

from eagletree.app.training import depth_profile
from eagletree.app.training.chain_simulation import UnrolledDrafter
from eagletree.app.training.depth_profile import RankCounts
from eagletree.app.training.prompt_lookup import simulate


def test_the_rank_profile_counts_depth_d_only_on_paths_accepted_through_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(depth_profile, "MIN_ROWS", 1)
    # one window, 4 rows; the target's argmax at row q is 10 + q, the held-out tokens agree
    # with it except at row 2
    choice = torch.tensor([[10, 11, 12, 13]])
    next_tokens = torch.tensor([[10, 11, 99, 13]])
    # step 0: top-1 right at rows 0, 1, 2, wrong at row 3 (its 2nd candidate right)
    step0 = torch.tensor([[[10, 5], [11, 5], [12, 5], [5, 13]]])
    # step 1: right at rows 1 and 3, 2nd candidate right at row 2
    step1 = torch.tensor([[[5, 6], [11, 6], [5, 12], [13, 6]]])
    probs0 = torch.full((1, 4, 2), 0.25)
    probs1 = torch.tensor([[[0.0, 0.0], [0.5, 0.1], [0.3, 0.2], [0.6, 0.4]]])
    # each draw's acceptance per row at each step: Σ min(p, q) for the first, 0.05 and 0.01
    # for the second at step 0 / 1, 0 after
    later = torch.tensor([0.0, 0.0])
    drawn0 = torch.tensor([[[v, 0.05, *later] for v in (0.9, 0.8, 0.7, 0.2)]])
    drawn1 = torch.tensor([[[v, 0.01, *later] for v in (0.1, 0.6, 0.4, 0.3)]])
    counts = RankCounts(num_steps=2, num_ranks=2)
    counts.add([step0, step1], [probs0, probs1], choice, next_tokens, [drawn0, drawn1])
    profile = counts.profile(coverage=None)
    # depth 0: every row; rank 0 right at 3 of 4 rows, rank 1 at 1
    assert profile.greedy[0] == [0.75, 0.25] and profile.sampled[0] == [0.25, 0.25]
    # depth 1 at row q needs step 0 right at row q − 1 with the held-out token equal to it:
    # rows 1 (root 0) and 2 (root 1); not row 3 (root 2: the held-out token differs)
    assert profile.rows == [4, 2] and profile.conditioned == [True, True]
    assert profile.greedy[1] == [0.5, 0.5]
    assert profile.sampled[1] == pytest.approx([0.4, 0.15])
    # drawn drafts on the same rows: depth 0 every row, depth 1 the rows 1 and 2
    assert profile.drawn[0] == pytest.approx([0.65, 0.05, 0.0, 0.0])
    assert profile.drawn[1] == pytest.approx([0.5, 0.01, 0.0, 0.0])
    # agreement: every row with a prefix (q ≥ s): step 1 right at rows 1 and 3 of rows 1..3
    assert profile.agreement == pytest.approx((0.75, 2 / 3))
    assert all(sum(row) <= 1 + 1e-9 for row in profile.greedy + profile.sampled)


def test_a_depth_with_too_few_accepted_paths_falls_back_to_every_row() -> None:
    choice = torch.tensor([[1, 2, 3]])
    top = torch.tensor([[[0], [0], [3]]])  # no step-0 hit: no path reaches depth 1
    counts = RankCounts(num_steps=2, num_ranks=1)
    counts.add([top, top], [torch.zeros(1, 3, 1)] * 2, choice, choice)
    profile = counts.profile(coverage=0.9)
    assert profile.conditioned == [False, False]
    assert profile.greedy[1] == [0.5]  # rows 1, 2: row 2 right
    fields = profile.as_dict()
    assert set(fields["rank_profile"]) == {"greedy", "sampled", "drawn"}
    assert fields["draft_vocab_coverage"] == 0.9


def test_the_offline_chain_proposes_the_unrolled_path_from_the_last_committed_token() -> None:
    # drafts[s][q]: step s at row q; row q reads the token at q + 1
    drafts = [[100 + q for q in range(6)], [200 + q for q in range(6)]]
    drafter = UnrolledDrafter(drafts)
    # context of 3 tokens: the last (position 2) is read by row 1; step s sits at row 1 + s
    assert drafter.propose([0, 0, 0]) == [101, 202]
    assert drafter.propose([0] * 7) == [105]  # the path runs off the sequence
    prompt, continuation = [7, 7], [1, 5, 102, 203, 9]  # its first token is the prefill's
    # step 1: context of 3 tokens → [101, 202] vs [5, ...]: none accepted, emit 1 (5)
    # step 2: context of 4 → [102, 203] both accepted, emit 3 (102, 203, 9)
    assert simulate(drafter, prompt, continuation) == [1, 3]


def test_the_drawn_overlap_is_the_sum_of_the_smaller_probability_per_token() -> None:
    # p = (0.5, 0.5, 0); step 0's q = (0.8, 0.1, 0.1): Σ min = 0.5 + 0.1 + 0 = 0.6, step 1's
    # q = (0.3, 0.6, 0.1): 0.3 + 0.5 = 0.8; a head over two of the three tokens (columns 2
    # and 0) with q = (0.25, 0.75): min(0, .25) + min(.5, .75) = .5
    target = torch.log(torch.tensor([[[0.5, 0.5, 1e-30]]]))
    steps = [
        torch.log(torch.tensor([[[0.8, 0.1, 0.1]]])),
        torch.log(torch.tensor([[[0.3, 0.6, 0.1]]])),
    ]
    first, second = depth_profile.drawn_acceptance(target, steps, None)
    assert first[..., 0] == pytest.approx(torch.tensor([[0.6]]))
    assert second[..., 0] == pytest.approx(torch.tensor([[0.8]]))
    narrow = torch.log(torch.tensor([[[0.25, 0.75]]]))
    mapping = torch.tensor([2, 0])
    (only,) = depth_profile.drawn_acceptance(target, [narrow], mapping)
    assert only[..., 0] == pytest.approx(torch.tensor([[0.5]]))


def test_a_later_draw_is_accepted_after_the_earlier_ones_were_rejected() -> None:
    # p = (0.2, 0.7, 0.1), q = (0.6, 0.4, 0): the first draw is accepted with 0.2 + 0.4; a coin
    # below 0.6 draws token 0 first, rejected with 1 − 0.2 / 0.6 = 2/3, leaving the residual
    # (0, 0.3, 0.1) / 0.4 = (0, 0.75, 0.25) against q without token 0, (0, 1, 0): the second
    # draw (token 1) is accepted with 0.75, so 2/3 · 0.75 = 1/2; it is rejected with 0.25,
    # leaving (0, 0, 1) and nothing to draw: the third and fourth are never accepted
    target = torch.log(torch.tensor([[[0.2, 0.7, 0.1]]]))
    head = torch.log(torch.tensor([[[0.6, 0.4, 0.0]]]))  # −inf: exactly 0 after the softmax
    (rates,) = depth_profile.drawn_acceptance(target, [head], None, coins=torch.zeros(1, 1, 3))
    assert rates[0, 0].tolist() == pytest.approx([0.6, 0.5, 0.0, 0.0], abs=1e-6)
    # over many rows with random draws the estimate is the expectation over the first draw:
    # token 1 first (0.4) is never rejected (p > q there), so the second draw's rate is 0.6 / 2
    rows = 20_000
    (rates,) = depth_profile.drawn_acceptance(
        target.expand(1, rows, 3), [head.expand(1, rows, 3)], None
    )
    assert float(rates[0, :, 1].mean()) == pytest.approx(0.3, abs=0.01)
    # a head over tokens 0 and 1 alone: p keeps its mass outside them (0.1) in the residual,
    # which the second draw is tested against: the same 1/2 (without it, 2/3)
    narrow = torch.log(torch.tensor([[[0.6, 0.4]]]))
    (rates,) = depth_profile.drawn_acceptance(
        target, [narrow], torch.tensor([0, 1]), coins=torch.zeros(1, 1, 3)
    )
    assert rates[0, 0].tolist() == pytest.approx([0.6, 0.5, 0.0, 0.0], abs=1e-6)
