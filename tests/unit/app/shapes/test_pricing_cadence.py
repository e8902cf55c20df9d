"""How often the adaptive policy prices, against hand-set costs: expected tokens recomputed ever
more rarely, a pricing kept for some steps of one batch size, and a profile that moves priced
again at once."""

from __future__ import annotations

import pytest

from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape, RankProfile, expected_accepted

from .policy_fixtures import ACCEPTING, CHAIN, COSTS, PESSIMISTIC, REJECTING, SHAPES, requests_at


def test_expected_tokens_are_recomputed_ever_more_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    import eagletree.app.workers.shapes.band_acceptance as module

    computed = []

    def counted(shape: DraftShape, profile: RankProfile) -> float:
        computed.append(shape)
        return expected_accepted(shape, profile)

    monkeypatch.setattr(module, "expected_accepted", counted)
    # a profile that never drifts (the cadence alone; the drift's own test is below); one path
    # a step is a whole step's
    policy = AdaptiveShapes(
        SHAPES, refresh_steps=2, reprice_every=1, drift=float("inf"), observe_per_step=1
    )
    policy.use_costs(COSTS)
    batch = requests_at([0.0])
    computations = []
    for step in range(100):
        before = len(computed)
        policy.choose(batch)
        if len(computed) > before:
            computations.append(step)
        policy.observe(CHAIN, batch, ACCEPTING)
    # at the first step, then after 2, 4, 8, 16, 32, 32 observed steps
    assert computations == [0, 2, 6, 14, 30, 62, 94]


def test_a_pricing_stands_for_reprice_every_steps_of_one_batch_size() -> None:
    # as in the test above, plain steps turn out to cost 1.6: the chain pays from then on
    prior = RankProfile(((0.8, 0.1), (0.0,)))
    policy = AdaptiveShapes(SHAPES, prior=prior, hysteresis=0.0, probe_every=1000)
    policy.use_costs(COSTS)
    batch = requests_at([1.0] * 8)
    assert policy.choose(batch) == PLAIN
    for _ in range(40):
        policy.observe_time(PLAIN, len(batch), True, 1.6)
    # a batch of another bucket is priced at once (bucket 1 borrows bucket 8's plain excess);
    # one of the same bucket, or the same batch, after 4 steps of a pricing
    assert policy.choose(batch[:1]) == CHAIN
    policy = AdaptiveShapes(SHAPES, prior=prior, hysteresis=0.0, probe_every=1000)
    policy.use_costs(COSTS)
    assert policy.choose(batch) == PLAIN
    for _ in range(40):
        policy.observe_time(PLAIN, len(batch), True, 1.6)
    assert [policy.choose(b) for b in (batch, batch[:7], batch[:5], batch)] == [PLAIN] * 3 + [CHAIN]


def _steps_until_plain(drift: float) -> int:
    """A batch of eight accepts everything for 200 steps (the estimate settles, the refreshes
    thin out to one per 64 observed steps); then it accepts nothing: the steps until
    the policy prices plain decoding best (no explorations: a plain step explored is no
    choice). The chain's calibration is held at its model: it prices a shape that runs by what
    its steps accepted over hundreds of requests, and here the profile's drift is measured."""
    policy = AdaptiveShapes(
        SHAPES, prior=PESSIMISTIC, reprice_every=1, probe_every=1000, explore_every=1000,
        drift=drift, calibration_weight=1e6, observe_per_step=8,
    )  # fmt: skip
    policy.use_costs(COSTS)
    eight = requests_at([0.0] * 8)
    for _ in range(200):
        policy.choose(eight)
        policy.observe(CHAIN, eight, ACCEPTING * 8)
    assert policy.choose(eight) == CHAIN
    for step in range(200):
        if policy.choose(eight) == PLAIN:
            return step
        policy.observe(CHAIN, eight, REJECTING * 8)
    raise AssertionError("never turned to plain")


def test_a_profile_that_moves_is_priced_again_at_once() -> None:
    # drift 0: the expected tokens recomputed at every observed step, the earliest possible
    fresh = _steps_until_plain(0.0)
    # a 10 % drift reprices within two steps of that; the cadence alone waits for its turn
    # (every 64 observed steps by then: the 316th, 116 steps into the refusals, where a fresh
    # estimate turned to plain after 95: 200 steps accepting outweigh that many refusing)
    assert _steps_until_plain(0.1) <= fresh + 2
    assert _steps_until_plain(float("inf")) >= fresh + 15


def _steps_until_deeper(drift: float) -> int:
    """A batch of 64 whose prior (every depth accepted half the time) prices a chain S1 best;
    its requests accept every draft, under which a chain S3 pays: the steps until the policy
    drafts it (no explorations, which would run it anyway)."""
    shallow, deep = DraftShape.chain(1), DraftShape.chain(3)
    table = {shallow: 1.0, deep: 1.3}
    costs = StepCosts((64,), {(s, 64, b): table[s] for s in table for b in (False, True)})
    policy = AdaptiveShapes(
        (shallow, deep), prior=RankProfile(((0.5,),)), probe_every=10**6,
        explore_every=10**6, drift=drift,
    )  # fmt: skip
    policy.use_costs(costs)
    batch = requests_at([0.0] * 64)
    for step in range(100):
        if policy.choose(batch) == deep:
            return step
        policy.observe(shallow, batch, [[0, 1]] * 64)
    raise AssertionError("never drafted the deeper chain")


def test_a_batchs_first_paths_price_it_again_when_they_move_it_off_its_prior() -> None:
    # the pricing of a batch of 64 stands for 16 steps, and its first record (one step in
    # four there) moves depth 1 from 0.5 to 0.9: measured from the prior that priced it, that
    # drift prices the batch again at the next step; the cadence alone waits for its turn
    assert _steps_until_deeper(0.1) <= 4
    assert _steps_until_deeper(float("inf")) == 16
