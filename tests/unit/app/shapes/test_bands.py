"""The adaptive policy's acceptance by temperature band, against hand-set costs: a batch priced
band by band as the per-request sum would, each band's start from the head's prior, the bounded,
rotating sample of requests a step records, drawn drafts learnt apart from top-k ones, and a
tree priced by what it accepted."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.band_acceptance import drawn_band, temperature_band
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.acceptance_profile import AcceptanceProfile
from eagletree.domain.draft_shape import (
    PLAIN,
    DraftShape,
    RankProfile,
    expected_accepted,
    mean_profile,
)

from .policy_fixtures import ACCEPTING, CHAIN, COSTS, PESSIMISTIC, SHAPES, requests_at


def test_a_mixed_batch_is_priced_per_band_as_the_sum_over_itsrequests_at() -> None:
    greedy, hot = RankProfile(((0.9,),)), RankProfile(((0.1,),))
    policy = AdaptiveShapes(
        SHAPES, head_priors={"greedy": greedy, "sampled": hot}, hysteresis=0, reprice_every=1
    )
    policy.use_costs(COSTS)
    # per request the chain commits 1 + E accepted; E from each band's prior
    e_greedy, e_hot = expected_accepted(CHAIN, greedy), expected_accepted(CHAIN, hot)
    choices = []
    for temperatures in ([0.0] * 6 + [1.0] * 2, [0.0] * 2 + [1.0] * 6):
        batch = requests_at(temperatures)
        chain_tokens = sum(
            1 + (e_greedy if temperature_band(r) == "greedy" else e_hot) for r in batch
        )
        expected = CHAIN if chain_tokens / 2.0 > len(batch) / 1.0 else PLAIN
        choices.append(policy.choose(batch))
        assert choices[-1] == expected
    assert set(choices) == {CHAIN, PLAIN}  # the two batches were priced differently


def test_each_band_starts_from_the_head_prior_of_its_temperature() -> None:
    greedy, hot = RankProfile(((0.9, 0.05),)), RankProfile(((0.3, 0.2),))
    policy = AdaptiveShapes(SHAPES, head_priors={"greedy": greedy, "sampled": hot})
    assert policy.profile("greedy") == greedy and policy.profile("T<=0.5") == greedy
    assert policy.profile("T>0.85") == hot
    # between them a temperature accepts between the two measured ones
    assert policy.profile("T<=0.85") == mean_profile(greedy, hot)
    assert policy.profile("T<=0.85").rate(0, 0) == pytest.approx(0.6)
    # drawn drafts: from the head's measured drawn profile at T 1 (its first draw; the later
    # draws' rates are the T 1 profile's lower ranks, scaled to leave the rows probabilities),
    # from between it and the greedy one at T 0.5–0.85, and without one from between greedy and
    # T 1 argmax chains
    drawn = RankProfile(((0.6,), (0.9,)))
    measured = AdaptiveShapes(
        SHAPES, head_priors={"greedy": greedy, "sampled": hot, "drawn": drawn}
    )
    widened = measured.profile(drawn_band("T>0.85"))
    assert widened.hit_rates[0] == (0.6, 0.2)
    assert widened.hit_rates[1] == pytest.approx((0.9, 0.1))  # 0.2 scaled to the 0.1 left
    assert measured.profile(drawn_band("T<=0.85")) == mean_profile(greedy, widened)
    assert measured.profile(drawn_band("T<=0.5")) == greedy
    assert policy.profile(drawn_band("T>0.85")) == mean_profile(greedy, hot)
    # a head without measured priors: the policy's own prior for every band
    bare = AdaptiveShapes(SHAPES, prior=PESSIMISTIC)
    assert {bare.profile(b) for b in ("greedy", "T<=0.5", "T<=0.85", "T>0.85")} == {PESSIMISTIC}


@pytest.mark.parametrize("batch_size", [3, 20])
def test_each_step_records_a_bounded_sample_of_itsrequests_at(batch_size: int) -> None:
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, prior_weight=0.0, observe_per_step=8)
    batch = requests_at([0.0] * batch_size)
    policy.observe(CHAIN, batch, ACCEPTING * batch_size)
    profile = policy.acceptance.learned("greedy")
    assert profile is not None
    # one exposure per recorded request at depth 1 (the prior weighs nothing)
    assert profile.exposures(0, 0) == pytest.approx(min(batch_size, 8))


def test_the_sample_rotates_through_the_batch_so_each_band_gets_its_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import eagletree.app.workers.shapes.band_acceptance as module

    recorded: list[tuple[int, int]] = []  # (profile, requests) per record call

    class Counting(AcceptanceProfile):
        def record(
            self, paths: Sequence[tuple[Sequence[int], Sequence[int]]], *, steps: float = 1.0
        ) -> int:
            recorded.append((id(self), len(paths)))
            return super().record(paths, steps=steps)

    monkeypatch.setattr(module, "AcceptanceProfile", Counting)
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, observe_per_step=8)
    batch = requests_at([0.0] * 10 + [1.0] * 10)  # the bands in two blocks
    for _ in range(5):
        policy.observe(CHAIN, batch, ACCEPTING * len(batch))
    per_band = {id(policy.acceptance.learned(b)): 0 for b in ("greedy", "T>0.85")}
    for profile, count in recorded:
        per_band[profile] += count
    # 8 a step from a start that moves 8 on: 40 picks, every request twice, each band 20
    assert sum(per_band.values()) == 40
    assert list(per_band.values()) == [20, 20]


@pytest.mark.parametrize("drawn", [True, False], ids=["drawn-drafts", "top-k-drafts"])
def test_a_sampling_bands_drawn_drafts_learn_apart_from_its_top_k_drafts(drawn: bool) -> None:
    # chains and trees cost two plain steps; from the T 1 prior (0.3 a depth) neither pays,
    # nor from a drawn draft's (the mean of the greedy and T 1 priors, 0.4)
    tree = DraftShape(3, 2, 4)
    shapes = (PLAIN, CHAIN, tree)
    seconds = {(s, b, sampled): (1.0 if s.is_plain else 2.0) for s in shapes for b in (1, 8)
               for sampled in (False, True)}  # fmt: skip
    hot, greedy = RankProfile(((0.3, 0.1),)), RankProfile(((0.5, 0.1),))
    policy = AdaptiveShapes(
        shapes,
        head_priors={"greedy": greedy, "sampled": hot},
        hysteresis=0.0,
        refresh_steps=1,
        probe_every=1000,
        reprice_every=1,
        drawn_drafts=drawn,
    )
    policy.use_costs(StepCosts((1, 8), seconds))
    batch = requests_at([1.0] * 4)
    assert policy.choose(batch) == PLAIN
    for _ in range(30):  # the chains accept every draft of the T 1 requests
        policy.observe(CHAIN, batch, ACCEPTING * 4)
    drawn_class = drawn_band("T>0.85")
    learned, other = (drawn_class, "T>0.85") if drawn else ("T>0.85", drawn_class)
    assert policy.profile(learned).rate(0, 0) > 0.8
    assert policy.acceptance.learned(other) is None  # drawn and top-k drafts never mix
    assert policy.acceptance.learned(drawn_band("greedy")) is None
    assert policy.choose(batch) in (CHAIN, tree)  # drafting pays now
    # a greedy request's chain drafts its argmax: its steps teach the greedy band
    policy.observe(CHAIN, requests_at([0.0]), ACCEPTING)
    assert policy.acceptance.learned("greedy") is not None


def test_a_tree_that_accepts_more_than_its_static_tree_is_priced_by_what_it_accepted() -> None:
    # a step of the tree costs 1.15 chain steps; by the profile's static tree it accepts 1.16
    # drafts a request (0.6, 0.36, 0.2) to the chain's 0.96: 1.88 tokens a chain step's time
    # against the chain's 1.96, so the chain runs — until the tree's own steps say otherwise
    chain, tree = DraftShape.chain(2), DraftShape(2, 2, 4)
    profile = RankProfile(((0.6, 0.2), (0.6, 0.2)))
    seconds = {(s, b, sampled): 1.15 if s == tree else 1.0 for s in (chain, tree)
               for b in (1, 8) for sampled in (False, True)}  # fmt: skip
    # a heavy prior: the profile stays where it is, what moves is the tree's calibration
    policy = AdaptiveShapes(
        (chain, tree), prior=profile, prior_weight=1e6, hysteresis=0.0, reprice_every=1,
        observe_per_step=8,
    )  # fmt: skip
    policy.use_costs(StepCosts((1, 8), seconds))
    batch = requests_at([0.0] * 8)
    modelled = expected_accepted(tree, profile)
    assert modelled == pytest.approx(1.16)
    assert policy.choose(batch) == chain
    assert policy.expected_accepted(0.0)[1] == pytest.approx(modelled)
    steps = 16
    for _ in range(steps):  # each of its requests accepts both drafts: 2 against 1.16
        policy.observe(tree, batch, [[0, 0, 2, 2]] * len(batch))
    # decayed sums over the 16 steps (half-life 64), the prior 16 requests at the model's mean
    weights = sum(0.5 ** (age / 64) for age in range(steps))
    observed, requests = 2.0 * 8 * weights, 8 * weights
    factor = (observed + 16 * modelled) / (modelled * requests + 16 * modelled)
    assert policy.expected_accepted(0.0)[1] == pytest.approx(modelled * factor, rel=1e-3)
    # the profile's model alone, before the calibration
    assert policy.expected_accepted(0.0, calibrated=False)[1] == pytest.approx(modelled, rel=1e-3)
    chain_modelled = expected_accepted(chain, profile)
    assert policy.expected_accepted(0.0)[0] == pytest.approx(chain_modelled, rel=1e-3)
    assert policy.choose(batch) == tree


def test_requests_in_their_first_tokens_teach_the_profile_and_calibrate_no_shape() -> None:
    # every settled request accepts the tree's 2 drafts down its rank-0 line; those in their
    # first tokens (half of the batch) accept none: the profile learns from both, the tree's
    # calibration from the settled ones alone, so the tree is priced near what those accepted
    tree = DraftShape(2, 2, 4)

    def policy(settle_tokens: int) -> AdaptiveShapes:
        return AdaptiveShapes(
            (tree, PLAIN), prior=PESSIMISTIC, prior_weight=1e-3, settle_tokens=settle_tokens,
            observe_per_step=8,
        )  # fmt: skip

    settled, mixed, everyone = policy(8), policy(8), policy(0)
    batch = requests_at([0.0] * 4, generated=8) + requests_at([0.0] * 4, generated=7)
    both, nothing = [[0, 0, 2, 2]], [[-1, -1, 2, 0]]
    for _ in range(32):
        settled.observe(tree, batch[:4], both * 4)
        mixed.observe(tree, batch, both * 4 + nothing * 4)
        everyone.observe(tree, batch, both * 4 + nothing * 4)
    assert settled.profile("greedy").rate(0, 0) == pytest.approx(1.0, abs=1e-3)
    for learned in (mixed, everyone):  # half the paths accept at depth 1
        assert learned.profile("greedy").rate(0, 0) == pytest.approx(0.5, abs=1e-3)
        # depth 2 reached by the settled paths alone, all accepted; rank 1 never taken: the
        # static tree's best three nodes score 0.5, 0.5 and 0
        assert learned.expected_accepted(0.0, calibrated=False)[0] == pytest.approx(1.0, 1e-3)
    assert settled.expected_accepted(0.0)[0] == pytest.approx(2.0, abs=0.01)
    # calibrated by the settled requests' 2 drafts (less the prior's pull towards the model)
    assert mixed.expected_accepted(0.0)[0] > 1.8
    # calibrated by the mean of both halves, 1: its model's
    assert everyone.expected_accepted(0.0)[0] == pytest.approx(1.0, rel=0.01)


def test_a_chain_is_priced_by_its_line_rates_whatever_its_steps_accepted() -> None:
    # a heavy prior holds the profile at 0.6 a depth; every chain step accepts both drafts, as
    # every tree step does: the tree's calibration moves its price, the chain's stays its model
    chain, tree = DraftShape.chain(2), DraftShape(2, 2, 4)
    profile = RankProfile(((0.6, 0.2), (0.6, 0.2)))
    policy = AdaptiveShapes((chain, tree), prior=profile, prior_weight=1e6, observe_per_step=8)
    batch = requests_at([0.0] * 8)
    for _ in range(32):
        policy.observe(chain, batch, [[0, 0, 1, 1]] * len(batch))
        policy.observe(tree, batch, [[0, 0, 2, 2]] * len(batch))
    calibrated = policy.expected_accepted(0.0)
    modelled = policy.expected_accepted(0.0, calibrated=False)
    assert modelled[0] == pytest.approx(expected_accepted(chain, profile), rel=1e-3)
    assert calibrated[0] == pytest.approx(modelled[0], rel=1e-3)
    assert calibrated[1] > 1.2 * modelled[1]


def test_a_calibrated_shape_is_never_priced_past_the_drafts_it_verifies() -> None:
    # the prior says a tree S2 k2 N4 accepts 0.96 drafts; every step accepts both down its
    # rank-0 line: the profile rises towards 2, and the calibration, had it kept the ratios of
    # its first steps (2 against a model near 1), would price the tree past the 2 drafts a
    # path through it verifies
    tree = DraftShape(2, 2, 4)
    policy = AdaptiveShapes((tree,), prior=RankProfile(((0.6, 0.0), (0.6, 0.0))),
                            prior_weight=1.0)  # fmt: skip
    policy.use_costs(StepCosts((1, 8), {(tree, b, x): 1.0 for b in (1, 8)
                                        for x in (False, True)}))  # fmt: skip
    batch = requests_at([0.0] * 8)
    for _ in range(40):
        policy.choose(batch)
        policy.observe(tree, batch, [[0, 0, 2, 2]] * len(batch))
    assert policy.profile("greedy").rate(1, 0) > 0.9  # learned: the model now expects ~2
    (accepted,) = policy.expected_accepted(0.0)
    assert 1.99 < accepted <= 2.0
