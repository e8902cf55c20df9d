"""The adaptive policy on the host, against hand-set costs: it prices a batch by its temperature
bands as the per-request sum would, probes drafting when its estimate keeps it on plain steps
(a plain step observes nothing) and learns from the probe, and records a bounded sample of
each step's requests."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from eagletree.app.workers.adaptive_shapes import AdaptiveShapes
from eagletree.app.workers.band_acceptance import drawn_band, temperature_band
from eagletree.app.workers.step_costs import StepCosts
from eagletree.domain.acceptance_profile import AcceptanceProfile
from eagletree.domain.draft_shape import (
    PLAIN,
    DraftShape,
    RankProfile,
    expected_accepted,
    mean_profile,
)
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams

CHAIN = DraftShape.chain(3)
SHAPES = (CHAIN, PLAIN)
# a chain step costs two plain steps: it pays when it commits more than two tokens
COSTS = StepCosts(
    (1, 8),
    {(s, b, sampled): (2.0 if s == CHAIN else 1.0) for s in SHAPES for b in (1, 8)
     for sampled in (False, True)},
)  # fmt: skip
PESSIMISTIC = RankProfile(((0.2,),))  # the chain would commit 1.25 tokens: plain wins
ACCEPTING = [[0, 0, 0, 1, 1, 1]]  # every draft of a chain S3 accepted


def _requests(temperatures: Sequence[float]) -> list[Request]:
    return [
        Request(i, [1, 2], SamplingParams(max_new_tokens=8, temperature=t, seed=i), 64)
        for i, t in enumerate(temperatures)
    ]


def test_a_mixed_batch_is_priced_per_band_as_the_sum_over_its_requests() -> None:
    greedy, hot = RankProfile(((0.9,),)), RankProfile(((0.1,),))
    policy = AdaptiveShapes(
        SHAPES, head_priors={"greedy": greedy, "sampled": hot}, hysteresis=0, reprice_every=1
    )
    policy.use_costs(COSTS)
    # per request the chain commits 1 + E accepted; E from each band's prior
    e_greedy, e_hot = expected_accepted(CHAIN, greedy), expected_accepted(CHAIN, hot)
    choices = []
    for temperatures in ([0.0] * 6 + [1.0] * 2, [0.0] * 2 + [1.0] * 6):
        batch = _requests(temperatures)
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


def test_a_band_kept_on_plain_steps_probes_drafting_and_learns_from_it() -> None:
    policy = AdaptiveShapes(
        SHAPES, prior=PESSIMISTIC, hysteresis=0.0, probe_every=4, refresh_steps=64
    )
    policy.use_costs(COSTS)
    batch = _requests([0.0] * 8)
    assert [policy.choose(batch) for _ in range(3)] == [PLAIN] * 3
    assert policy.choose(batch) == CHAIN  # the fourth plain step probes
    # the probe stands until a drafting step is read back (a catch-up may run first)
    assert policy.choose(batch) == CHAIN
    policy.observe(CHAIN, batch, ACCEPTING * len(batch))  # 8 paths outweigh the prior's 4
    # what the probe read is priced at once, not after the 64 steps of a refresh
    assert policy.choose(batch) == CHAIN  # drafting now on merit
    assert policy.profile("greedy").rate(0, 0) > 0.5


def test_probes_thin_out_while_plain_stays_right() -> None:
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, hysteresis=0.0, probe_every=4)
    policy.use_costs(COSTS)
    batch = _requests([1.0])
    probes = []
    for step in range(4 + 8 + 16 + 32):
        if policy.choose(batch) == CHAIN:
            probes.append(step)
            policy.observe(CHAIN, batch, [[-1, -1, -1, 1, 0, 0]])  # nothing accepted
    assert probes == [3, 11, 27, 59]  # after 4, 8, 16, 32 plain steps


@pytest.mark.parametrize("batch_size", [3, 20])
def test_each_step_records_a_bounded_sample_of_its_requests(batch_size: int) -> None:
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, prior_weight=0.0, observe_per_step=8)
    batch = _requests([0.0] * batch_size)
    policy.observe(CHAIN, batch, ACCEPTING * batch_size)
    profile = policy.acceptance.learned("greedy")
    assert profile is not None
    # one exposure per recorded request at depth 1 (the prior weighs nothing)
    assert profile.exposures(0, 0) == pytest.approx(min(batch_size, 8))


def test_the_sample_rotates_through_the_batch_so_each_band_gets_its_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import eagletree.app.workers.band_acceptance as module

    recorded: list[tuple[int, int]] = []  # (profile, requests) per record call

    class Counting(AcceptanceProfile):
        def record(self, paths: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
            recorded.append((id(self), len(paths)))
            super().record(paths)

    monkeypatch.setattr(module, "AcceptanceProfile", Counting)
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, observe_per_step=8)
    batch = _requests([0.0] * 10 + [1.0] * 10)  # the bands in two blocks
    for _ in range(5):
        policy.observe(CHAIN, batch, ACCEPTING * len(batch))
    per_band = {id(policy.acceptance.learned(b)): 0 for b in ("greedy", "T>0.85")}
    for profile, count in recorded:
        per_band[profile] += count
    # 8 a step from a start that moves 8 on: 40 picks, every request twice, each band 20
    assert sum(per_band.values()) == 40
    assert list(per_band.values()) == [20, 20]


def test_expected_tokens_are_recomputed_ever_more_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    import eagletree.app.workers.band_acceptance as module

    computed = []

    def counted(shape: DraftShape, profile: RankProfile) -> float:
        computed.append(shape)
        return expected_accepted(shape, profile)

    monkeypatch.setattr(module, "expected_accepted", counted)
    # a profile that never drifts (the cadence alone; the drift's own test is below)
    policy = AdaptiveShapes(SHAPES, refresh_steps=2, reprice_every=1, drift=float("inf"))
    policy.use_costs(COSTS)
    batch = _requests([0.0])
    computations = []
    for step in range(100):
        before = len(computed)
        policy.choose(batch)
        if len(computed) > before:
            computations.append(step)
        policy.observe(CHAIN, batch, ACCEPTING)
    # at the first step, then after 2, 4, 8, 16, 32, 32 observed steps
    assert computations == [0, 2, 6, 14, 30, 62, 94]


def test_plain_steps_that_cost_more_than_measured_make_drafting_pay() -> None:
    # the chain would commit 1.8 tokens for its two measured plain steps: plain wins on the
    # table; but plain steps take 1.6 as the engine runs them (host work the replay does not
    # pay, which a chain step pays as well): 1.8 / 2.6 > 1 / 1.6
    prior = RankProfile(((0.8, 0.1), (0.0,)))
    assert 1 + expected_accepted(CHAIN, prior) == pytest.approx(1.8)
    policy = AdaptiveShapes(SHAPES, prior=prior, hysteresis=0.0, probe_every=1000, reprice_every=1)
    policy.use_costs(COSTS)
    batch = _requests([1.0] * 8)
    assert policy.choose(batch) == PLAIN
    for _ in range(40):
        policy.observe_time(PLAIN, len(batch), True, 1.6)
    assert policy.costs is not None
    assert policy.costs.of(CHAIN, len(batch), True) == pytest.approx(2.6, rel=1e-3)
    assert policy.choose(batch) == CHAIN
    # greedy plain steps, none timed, borrow the sampled ones' excess (the host's share hardly
    # depends on the sampling), and so does the other bucket
    assert policy.costs.of(PLAIN, 8, False) == pytest.approx(1.6, rel=1e-3)
    assert policy.costs.of(PLAIN, 1, True) == pytest.approx(1.6, rel=1e-3)


def test_a_close_runner_up_never_timed_runs_and_its_real_time_decides() -> None:
    tree = DraftShape(3, 2, 6)
    prior = RankProfile(((0.9, 0.05),))
    tokens = {s: 1 + expected_accepted(s, prior) for s in (tree, CHAIN)}
    # the table: the tree 10 % faster than the chain (2 s a step), plain far behind; as the
    # engine runs, the tree's steps take 30 % more than the table says, the others as said
    tree_seconds = tokens[tree] / (1.1 * tokens[CHAIN] / 2.0)
    table = {CHAIN: 2.0, tree: tree_seconds, PLAIN: 1.0}
    real = {CHAIN: 2.0, tree: 1.3 * tree_seconds, PLAIN: 1.0}
    costs = StepCosts((1,), {(s, 1, b): table[s] for s in table for b in (False, True)})
    policy = AdaptiveShapes(
        (tree, CHAIN, PLAIN), prior=prior, hysteresis=0.0, probe_every=1000, explore_every=4
    )
    policy.use_costs(costs)
    batch = _requests([0.0])
    ran = []
    for _ in range(16):
        ran.append(policy.choose(batch))
        policy.observe_time(ran[-1], 1, False, real[ran[-1]])
    # the tree's time, learned, lifts the chain's guess as much (the excess is shared), so
    # the tree still looks best until the fourth step explores the chain; timed, the chain
    # wins on its own time (a second exploration while the tree's average settles); plain,
    # far behind, is never tried
    assert ran[:4] == [tree] * 3 + [CHAIN]
    assert ran[-8:] == [CHAIN] * 8 and PLAIN not in ran
    assert policy.costs is not None
    assert policy.costs.of(CHAIN, 1, False) == pytest.approx(2.0, rel=0.05)


def test_a_pricing_stands_for_reprice_every_steps_of_one_batch_size() -> None:
    # as in the test above, plain steps turn out to cost 1.6: the chain pays from then on
    prior = RankProfile(((0.8, 0.1), (0.0,)))
    policy = AdaptiveShapes(SHAPES, prior=prior, hysteresis=0.0, probe_every=1000)
    policy.use_costs(COSTS)
    batch = _requests([1.0] * 8)
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


@pytest.mark.parametrize(("stall_ratio", "drafted"), [(2.5, CHAIN), (3.5, DraftShape(3, 2, 6))])
def test_probes_and_explorations_run_no_step_priced_past_the_stall_ratio(
    stall_ratio: float, drafted: DraftShape
) -> None:
    tree = DraftShape(3, 2, 6)
    prior = RankProfile(((0.25, 0.7),))  # the tree commits 2.96 tokens a step, the chain 1.33
    # plain commits 1 token a second; the tree 0.99 (close behind), the chain 0.66 (far)
    table = {PLAIN: 1.0, CHAIN: 2.0, tree: 3.0}
    costs = StepCosts((1,), {(s, 1, b): table[s] for s in table for b in (False, True)})
    batch = _requests([0.0])
    shapes = (tree, CHAIN, PLAIN)
    probing = AdaptiveShapes(
        shapes, prior=prior, hysteresis=0.0, probe_every=4, explore_every=1000,
        stall_ratio=stall_ratio,
    )  # fmt: skip
    probing.use_costs(costs)
    # the fourth plain step probes with the best drafting shape whose step is short enough
    # among plain ones (at 2.5 the tree's, 3 × theirs, is not)
    assert [probing.choose(batch) for _ in range(4)] == [PLAIN] * 3 + [drafted]
    exploring = AdaptiveShapes(
        shapes, prior=prior, hysteresis=0.0, probe_every=1000, explore_every=2,
        stall_ratio=stall_ratio,
    )  # fmt: skip
    exploring.use_costs(costs)
    # plain steps explore nothing (a drafting step among them is the probes' to run), however
    # close the tree
    assert [exploring.choose(batch) for _ in range(6)] == [PLAIN] * 6
    # drafting on merit: the chain commits 1.72 tokens a second, the tree 3.59 in 2.55 s
    # (1.41, within the margin): explored only where its step is short enough
    close = RankProfile(((0.9, 0.08),))
    table = {PLAIN: 1.0, CHAIN: 2.0, tree: 2.55}
    costs = StepCosts((1,), {(s, 1, b): table[s] for s in table for b in (False, True)})
    exploring = AdaptiveShapes(
        shapes, prior=close, hysteresis=0.0, probe_every=1000, explore_every=2,
        stall_ratio=stall_ratio,
    )  # fmt: skip
    exploring.use_costs(costs)
    expected = CHAIN if drafted == CHAIN else tree
    assert [exploring.choose(batch) for _ in range(2)] == [CHAIN, expected]


@pytest.mark.parametrize(("stall_ratio", "chosen"), [(2.5, PLAIN), (3.5, DraftShape(3, 2, 6))])
def test_no_choice_is_priced_past_the_stall_ratio_over_the_cheapest_step(
    stall_ratio: float, chosen: DraftShape
) -> None:
    tree = DraftShape(3, 2, 6)
    prior = RankProfile(((0.3, 0.65),))  # the tree commits 2.84 tokens a step, the chain 1.42
    # on merit the tree (1.09 tokens a second) beats plain (1.0) and the chain (0.71), but its
    # step is 2.6 plain steps: past a ratio of 2.5 it is never run, however much it commits
    table = {PLAIN: 1.0, CHAIN: 2.0, tree: 2.6}
    costs = StepCosts((1,), {(s, 1, b): table[s] for s in table for b in (False, True)})
    policy = AdaptiveShapes(
        (tree, CHAIN, PLAIN), prior=prior, hysteresis=0.0, probe_every=1000,
        explore_every=1000, stall_ratio=stall_ratio,
    )  # fmt: skip
    policy.use_costs(costs)
    assert 1 + expected_accepted(tree, prior) > table[tree] * 1.0  # it would win on merit
    assert {policy.choose(_requests([0.0])) for _ in range(8)} == {chosen}


def _steps_until_plain(drift: float) -> int:
    """One request accepts everything for 200 steps (the estimate settles, the refreshes thin
    out to one per 64 observed steps); then a batch of eight accepts nothing: the steps until
    the policy prices plain decoding best (no explorations: a plain step explored is no
    choice)."""
    policy = AdaptiveShapes(
        SHAPES, prior=PESSIMISTIC, reprice_every=1, probe_every=1000, explore_every=1000,
        drift=drift,
    )  # fmt: skip
    policy.use_costs(COSTS)
    one, eight = _requests([0.0]), _requests([0.0] * 8)
    for _ in range(200):
        policy.choose(one)
        policy.observe(CHAIN, one, ACCEPTING)
    assert policy.choose(one) == CHAIN
    for step in range(100):
        if policy.choose(eight) == PLAIN:
            return step
        policy.observe(CHAIN, eight, [[-1, -1, -1, 1, 0, 0]] * 8)
    raise AssertionError("never turned to plain")


def test_a_profile_that_moves_is_priced_again_at_once() -> None:
    # drift 0: the expected tokens recomputed at every observed step, the earliest possible
    fresh = _steps_until_plain(0.0)
    # a 10 % drift reprices within two steps of that; the cadence alone waits for its turn
    # (every 64 observed steps by then: the 252nd, 52 steps into the batch of eight)
    assert _steps_until_plain(0.1) <= fresh + 2
    assert _steps_until_plain(float("inf")) >= fresh + 30


def test_a_shape_past_the_stall_ratio_at_a_batch_size_costs_no_expected_tokens_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import eagletree.app.workers.band_acceptance as module

    wide = DraftShape(3, 2, 6)
    shapes = (CHAIN, PLAIN, wide)
    # the wide tree costs 3 plain steps at bucket 1 (within 3.5 x) and 5 at bucket 8 (past it)
    seconds = {CHAIN: (2.0, 2.0), PLAIN: (1.0, 1.0), wide: (3.0, 5.0)}
    costs = StepCosts(
        (1, 8),
        {(s, b, sampled): seconds[s][b > 1] for s in shapes for b in (1, 8)
         for sampled in (False, True)},
    )  # fmt: skip
    computed: list[DraftShape] = []

    def counted(shape: DraftShape, profile: RankProfile) -> float:
        computed.append(shape)
        return expected_accepted(shape, profile)

    monkeypatch.setattr(module, "expected_accepted", counted)
    policy = AdaptiveShapes(shapes, stall_ratio=3.5, reprice_every=1)
    policy.use_costs(costs)
    policy.choose(_requests([0.0] * 8))
    assert sorted(map(str, computed)) == sorted(map(str, (CHAIN, PLAIN)))  # not the tree's
    policy.choose(_requests([0.0]))  # at bs 1 the tree may run: its tokens are needed now
    assert computed.count(wide) == 1
    policy.choose(_requests([0.0]))  # cached until the band's next refresh
    assert len(computed) == 3


def test_from_plain_steps_drafting_pays_its_catch_up_and_from_drafting_it_does_not() -> None:
    # plain steps cost 1 s, a catch-up 3 s (a plain step that extends the draft), a chain 2 s;
    # from plain the chain's step is priced 2 + 0.5 x (3 - 1) / 4 = 2.25 s (the switch's
    # catch-up, half of it, over the 4 steps a pricing stands for)
    costs = StepCosts(COSTS.buckets, COSTS.seconds, {(b, s): 3.0 for b in (1, 8)
                      for s in (False, True)}, catch_up_every=16)  # fmt: skip
    batch = _requests([0.0])

    def policy_with(rate: float, current: DraftShape) -> AdaptiveShapes:
        # a greedy prior whose chain accepts its first two drafts at ``rate``, not its third
        prior = RankProfile(((rate,), (rate,), (0.0,)))
        policy = AdaptiveShapes((current, *(s for s in SHAPES if s != current)), prior=prior,
                                hysteresis=0.0, probe_every=1000, reprice_every=4)  # fmt: skip
        policy.use_costs(costs)
        return policy

    plain_rate = 1.0 / ((15 * 1.0 + 3.0) / 16)  # plain steps with their catch-ups: 1.125 s
    close = 1 + 0.6 + 0.6**2  # the chain's tokens a step at rate 0.6: 1.96
    assert close / 2.0 > plain_rate > close / 2.25  # faster than plain, not by the switch
    assert policy_with(0.6, current=PLAIN).choose(batch) == PLAIN
    assert policy_with(0.6, current=CHAIN).choose(batch) == CHAIN
    assert plain_rate < (1 + 0.9 + 0.9**2) / 2.25  # by more than the switch: it drafts
    assert policy_with(0.9, current=PLAIN).choose(batch) == CHAIN


def test_a_table_that_overstates_every_step_still_leaves_a_shape_to_choose() -> None:
    # the start-up table: a plain step 1 s at bucket 1 and 4 s at bucket 8, a chain step twice
    # that; the engine's plain steps at bucket 8 take 0.5 s. A batch of one (bucket 1) borrows
    # that excess (-3.5 s), which would price both its steps below zero and keep no candidate
    table = {(s, b, sampled): (2.0 if s == CHAIN else 1.0) * (1 if b == 1 else 4)
             for s in SHAPES for b in (1, 8) for sampled in (False, True)}  # fmt: skip
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, probe_every=1000, reprice_every=1)
    policy.use_costs(StepCosts((1, 8), table))
    batch = _requests([1.0] * 8)
    for _ in range(8):
        policy.observe_time(PLAIN, len(batch), True, 0.5)
    assert policy.choose(batch[:1]) == PLAIN  # the chain would commit 1.25 tokens for 2 steps
    assert policy.costs is not None  # each step priced at a quarter of its table
    assert [policy.costs.of(s, 1, True) for s in SHAPES] == [0.25 * 2.0, 0.25 * 1.0]


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
    batch = _requests([1.0] * 4)
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
    policy.observe(CHAIN, _requests([0.0]), ACCEPTING)
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
        (chain, tree), prior=profile, prior_weight=1e6, hysteresis=0.0, reprice_every=1
    )
    policy.use_costs(StepCosts((1, 8), seconds))
    batch = _requests([0.0] * 8)
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
    chain_modelled = expected_accepted(chain, profile)
    assert policy.expected_accepted(0.0)[0] == pytest.approx(chain_modelled, rel=1e-3)
    assert policy.choose(batch) == tree


def test_a_calibrated_shape_is_never_priced_past_the_drafts_it_verifies() -> None:
    # the prior says a chain S2 accepts 0.96 drafts; every step accepts both: the profile
    # rises towards 2, and the calibration, had it kept the ratios of its first steps (2
    # against a model near 1), would price the chain past the 2 drafts it verifies
    chain = DraftShape.chain(2)
    policy = AdaptiveShapes((chain,), prior=RankProfile(((0.6,), (0.6,))), prior_weight=1.0)
    policy.use_costs(StepCosts((1, 8), {(chain, b, x): 1.0 for b in (1, 8)
                                        for x in (False, True)}))  # fmt: skip
    batch = _requests([0.0] * 8)
    for _ in range(40):
        policy.choose(batch)
        policy.observe(chain, batch, [[0, 0, 1, 1]] * len(batch))
    assert policy.profile("greedy").rate(1, 0) > 0.9  # learned: the model now expects ~2
    (accepted,) = policy.expected_accepted(0.0)
    assert 1.99 < accepted <= 2.0


def test_the_stall_limit_follows_the_steps_a_batch_has_been_taking() -> None:
    # the table prices plain at 1 s and the deep chain at 2.6 (past 2.5 plain steps); the
    # shallow chain's steps have been taking 1.5 s: 2.6 is 1.7 of those, no stall, and the
    # deep chain, committing the most a second, runs
    shallow, deep = DraftShape.chain(1), DraftShape.chain(6)
    table = {PLAIN: 1.0, shallow: 1.2, deep: 2.6}
    costs = StepCosts((1,), {(s, 1, b): table[s] for s in table for b in (False, True)})
    profile = RankProfile(((0.95,),))
    policy = AdaptiveShapes(
        (shallow, PLAIN, deep), prior=profile, prior_weight=1e6, hysteresis=0.0,
        reprice_every=1, probe_every=1000, explore_every=1000,
    )  # fmt: skip
    policy.use_costs(costs)
    batch = _requests([0.0])
    assert policy.choose(batch) == shallow  # 2.6 > 2.5 × the cheapest (plain's 1 s)
    for _ in range(20):
        policy.observe_time(shallow, 1, False, 1.5)
    assert policy.costs is not None
    assert policy.costs.median_step(1, False) == pytest.approx(1.5)
    assert policy.choose(batch) == deep


def test_by_default_a_shape_a_little_faster_than_the_current_one_is_taken() -> None:
    prior = RankProfile(((0.56,),))
    tokens = 1 + expected_accepted(CHAIN, prior)  # a greedy request's, a chain step
    # per plain step's second the chain commits 2 % more than plain decoding
    costs = StepCosts(
        (1, 8),
        {(s, b, sampled): (tokens / 1.02 if s == CHAIN else 1.0) for s in SHAPES
         for b in (1, 8) for sampled in (False, True)},
    )  # fmt: skip
    default = AdaptiveShapes((PLAIN, CHAIN), prior=prior, reprice_every=1)
    margin = AdaptiveShapes((PLAIN, CHAIN), prior=prior, reprice_every=1, hysteresis=0.05)
    for policy, expected in ((default, CHAIN), (margin, PLAIN)):
        policy.use_costs(costs)
        assert policy.choose(_requests([0.0] * 4)) == expected  # from plain, its first shape
