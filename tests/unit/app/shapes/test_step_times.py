"""The adaptive policy's step times as the engine runs them, against hand-set costs: plain steps
slower than measured make drafting pay, and no step is run or priced past the stall ratio over
the cheapest one, which follows the steps a batch has been taking."""

from __future__ import annotations

import pytest

from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape, RankProfile, expected_accepted

from .policy_fixtures import CHAIN, COSTS, PESSIMISTIC, SHAPES, costs_of, requests_at


def test_plain_steps_that_cost_more_than_measured_make_drafting_pay() -> None:
    # the chain would commit 1.8 tokens for its two measured plain steps: plain wins on the
    # table; but plain steps take 1.6 as the engine runs them (host work the replay does not
    # pay, which a chain step pays as well): 1.8 / 2.6 > 1 / 1.6
    prior = RankProfile(((0.8, 0.1), (0.0,)))
    assert 1 + expected_accepted(CHAIN, prior) == pytest.approx(1.8)
    policy = AdaptiveShapes(SHAPES, prior=prior, hysteresis=0.0, probe_every=1000, reprice_every=1)
    policy.use_costs(COSTS)
    batch = requests_at([1.0] * 8)
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


@pytest.mark.parametrize(("stall_ratio", "drafted"), [(2.5, CHAIN), (3.5, DraftShape(3, 2, 6))])
def test_probes_and_explorations_run_no_step_priced_past_the_stall_ratio(
    stall_ratio: float, drafted: DraftShape
) -> None:
    tree = DraftShape(3, 2, 6)
    prior = RankProfile(((0.25, 0.7),))  # the tree commits 2.96 tokens a step, the chain 1.33
    # plain commits 1 token a second; the tree 0.99 (close behind), the chain 0.66 (far)
    table = {PLAIN: 1.0, CHAIN: 2.0, tree: 3.0}
    costs = costs_of(table)
    batch = requests_at([0.0])
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
    costs = costs_of(table)
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
    costs = costs_of(table)
    policy = AdaptiveShapes(
        (tree, CHAIN, PLAIN), prior=prior, hysteresis=0.0, probe_every=1000,
        explore_every=1000, stall_ratio=stall_ratio,
    )  # fmt: skip
    policy.use_costs(costs)
    assert 1 + expected_accepted(tree, prior) > table[tree] * 1.0  # it would win on merit
    assert {policy.choose(requests_at([0.0])) for _ in range(8)} == {chosen}


def test_a_shape_past_the_stall_ratio_at_a_batch_size_costs_no_expected_tokens_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import eagletree.app.workers.shapes.band_acceptance as module

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
    policy.choose(requests_at([0.0] * 8))
    assert sorted(map(str, computed)) == sorted(map(str, (CHAIN, PLAIN)))  # not the tree's
    policy.choose(requests_at([0.0]))  # at bs 1 the tree may run: its tokens are needed now
    assert computed.count(wide) == 1
    policy.choose(requests_at([0.0]))  # cached until the band's next refresh
    assert len(computed) == 3


def test_the_stall_limit_follows_the_steps_a_batch_has_been_taking() -> None:
    # the table prices plain at 1 s and the deep chain at 2.6 (past 2.5 plain steps); the
    # shallow chain's steps have been taking 1.5 s: 2.6 is 1.7 of those, no stall, and the
    # deep chain, committing the most a second, runs
    shallow, deep = DraftShape.chain(1), DraftShape.chain(6)
    table = {PLAIN: 1.0, shallow: 1.2, deep: 2.6}
    costs = costs_of(table)
    profile = RankProfile(((0.95,),))
    policy = AdaptiveShapes(
        (shallow, PLAIN, deep), prior=profile, prior_weight=1e6, hysteresis=0.0,
        reprice_every=1, probe_every=1000, explore_every=1000,
    )  # fmt: skip
    policy.use_costs(costs)
    batch = requests_at([0.0])
    assert policy.choose(batch) == shallow  # 2.6 > 2.5 × the cheapest (plain's 1 s)
    for _ in range(20):
        policy.observe_time(shallow, 1, False, 1.5)
    assert policy.costs is not None
    assert policy.costs.median_step(1, False) == pytest.approx(1.5)
    assert policy.choose(batch) == deep


def test_a_batch_grown_into_a_new_bucket_is_limited_by_the_steps_below_it() -> None:
    # as above, over two buckets that cost alike: the shallow chain's steps took 1.5 s at one
    # bucket; a batch at the other, the first there, may run the deep chain (2.6 < 2.5 × 1.5)
    # where it grew from the smaller bucket, not where it shrank from the larger
    shallow, deep = DraftShape.chain(1), DraftShape.chain(6)
    table = {PLAIN: 1.0, shallow: 1.2, deep: 2.6}
    both = (False, True)
    costs = StepCosts((1, 8), {(s, b, x): table[s] for s in table for b in (1, 8) for x in both})

    def chosen(ran_at: int, batch_size: int) -> DraftShape:
        policy = AdaptiveShapes(
            (shallow, PLAIN, deep), prior=RankProfile(((0.95,),)), prior_weight=1e6,
            hysteresis=0.0, reprice_every=1, probe_every=1000, explore_every=1000,
        )  # fmt: skip
        policy.use_costs(costs)
        for _ in range(20):
            policy.observe_time(shallow, ran_at, False, 1.5)
        return policy.choose(requests_at([0.0] * batch_size))

    assert chosen(ran_at=1, batch_size=8) == deep
    assert chosen(ran_at=8, batch_size=1) == shallow


def test_a_table_that_overstates_every_step_still_leaves_a_shape_to_choose() -> None:
    # the start-up table: a plain step 1 s at bucket 1 and 4 s at bucket 8, a chain step twice
    # that; the engine's plain steps at bucket 8 take 0.5 s. A batch of one (bucket 1) borrows
    # that excess (-3.5 s), which would price both its steps below zero and keep no candidate
    table = {(s, b, sampled): (2.0 if s == CHAIN else 1.0) * (1 if b == 1 else 4)
             for s in SHAPES for b in (1, 8) for sampled in (False, True)}  # fmt: skip
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, probe_every=1000, reprice_every=1)
    policy.use_costs(StepCosts((1, 8), table), warm_after=0)
    batch = requests_at([1.0] * 8)
    for _ in range(8):
        policy.observe_time(PLAIN, len(batch), True, 0.5)
    assert policy.choose(batch[:1]) == PLAIN  # the chain would commit 1.25 tokens for 2 steps
    assert policy.costs is not None  # each step priced at a quarter of its table
    assert [policy.costs.of(s, 1, True) for s in SHAPES] == [0.25 * 2.0, 0.25 * 1.0]


def test_an_engines_first_steps_do_not_price_plain_decoding_for_the_rest_of_its_run() -> None:
    # on the H100 a cold engine's first plain steps took about twice their table; learned, they
    # priced plain decoding for the rest of the run, in which only drafting steps ran
    prior = RankProfile(((0.8, 0.1), (0.0,)))  # the chain: 1.8 tokens for its 2 s
    policy = AdaptiveShapes(SHAPES, prior=prior, hysteresis=0.0, probe_every=1000, reprice_every=1)
    policy.use_costs(COSTS)  # the engine's default warm-up
    batch = requests_at([1.0] * 8)
    for _ in range(4):
        policy.observe_time(PLAIN, len(batch), True, 2.0)
    for _ in range(40):
        policy.observe_time(CHAIN, len(batch), True, 2.0)  # as its table says
    assert policy.costs is not None
    assert policy.costs.of(PLAIN, len(batch), True) == 1.0  # its table, nothing learned
    assert policy.choose(batch) == PLAIN  # 1 token a second against the chain's 0.9
