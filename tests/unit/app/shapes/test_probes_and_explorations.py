"""The adaptive policy trying what it does not run, against hand-set costs: a band kept on plain
steps probes drafting (ever more rarely while plain stays right), a close runner-up is explored
and its real time decides, and a return from plain steps pays the draft's catch-up."""

from __future__ import annotations

import pytest

from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape, RankProfile, expected_accepted

from .policy_fixtures import (
    ACCEPTING,
    CHAIN,
    COSTS,
    PESSIMISTIC,
    REJECTING,
    SHAPES,
    costs_of,
    requests_at,
)


def test_a_band_kept_on_plain_steps_probes_drafting_and_learns_from_it() -> None:
    policy = AdaptiveShapes(
        SHAPES, prior=PESSIMISTIC, hysteresis=0.0, probe_every=4, refresh_steps=64
    )
    policy.use_costs(COSTS)
    batch = requests_at([0.0] * 8)
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
    batch = requests_at([1.0])
    probes = []
    for step in range(4 + 8 + 16 + 32):
        if policy.choose(batch) == CHAIN:
            probes.append(step)
            policy.observe(CHAIN, batch, REJECTING)
    assert probes == [3, 11, 27, 59]  # after 4, 8, 16, 32 plain steps


def _probes_near_plain(costs: StepCosts, steps: int) -> list[int]:
    """The steps of ``steps`` at which a T 1 request probed the chain, probes due every 4 plain
    steps: the chain commits 1 + 0.5 + 0.25 + 0.125 tokens a step of two plain ones, 0.94 x
    plain, within the 20 % explore margin; the prior and calibration outweigh what probes read."""
    near = RankProfile(((0.5,),))
    policy = AdaptiveShapes(
        SHAPES, prior=near, prior_weight=1e9, calibration_weight=1e9, hysteresis=0.0,
        probe_every=4,
    )  # fmt: skip
    policy.use_costs(costs)
    batch = requests_at([1.0])
    probes = []
    for step in range(steps):
        if policy.choose(batch) == CHAIN:
            probes.append(step)
            policy.observe(CHAIN, batch, [[0, -1, -1, 1, 1, 0]])
    return probes


def test_probes_keep_their_pace_while_drafting_is_priced_near_plain() -> None:
    assert _probes_near_plain(COSTS, 24) == [3, 7, 11, 15, 19, 23]  # every 4, not 4, 8, 16


def test_probes_wait_for_the_draft_lag_to_fill() -> None:
    # a lag of 6 plain steps: a probe catches the draft up first, which costs the same however
    # full the lag is, so a probe every 4 plain steps would pay a catch-up every 4
    lagging = StepCosts(COSTS.buckets, COSTS.seconds, {(b, s): 1.1 for b in (1, 8)
                        for s in (False, True)}, catch_up_every=6)  # fmt: skip
    assert _probes_near_plain(lagging, 24) == [5, 11, 17, 23]


def test_a_close_runner_up_never_timed_runs_and_its_real_time_decides() -> None:
    tree = DraftShape(3, 2, 6)
    prior = RankProfile(((0.9, 0.05),))
    tokens = {s: 1 + expected_accepted(s, prior) for s in (tree, CHAIN)}
    # the table: the tree 10 % faster than the chain (2 s a step), plain far behind; as the
    # engine runs, the tree's steps take 30 % more than the table says, the others as said
    tree_seconds = tokens[tree] / (1.1 * tokens[CHAIN] / 2.0)
    table = {CHAIN: 2.0, tree: tree_seconds, PLAIN: 1.0}
    real = {CHAIN: 2.0, tree: 1.3 * tree_seconds, PLAIN: 1.0}
    costs = costs_of(table)
    policy = AdaptiveShapes(
        (tree, CHAIN, PLAIN), prior=prior, hysteresis=0.0, probe_every=1000, explore_every=4
    )
    policy.use_costs(costs, warm_after=0)
    batch = requests_at([0.0])
    ran = []
    for _ in range(24):
        ran.append(policy.choose(batch))
        policy.observe_time(ran[-1], 1, False, real[ran[-1]])
    # the tree's time, learned, lifts the chain's guess as much (the excess is shared), so
    # the tree still looks best until the fourth step explores the chain, for two steps (the
    # first, right after a tree step, teaches no time); timed, the chain wins on its own time
    # (a second exploration while the averages settle); plain, far behind, is never tried
    assert ran[:5] == [tree] * 3 + [CHAIN] * 2
    assert ran[-8:] == [CHAIN] * 8 and PLAIN not in ran
    assert policy.costs is not None
    assert policy.costs.of(CHAIN, 1, False) == pytest.approx(2.0, rel=0.05)


def test_from_plain_steps_drafting_pays_its_catch_up_and_from_drafting_it_does_not() -> None:
    # plain steps cost 1 s, a catch-up 3 s (a plain step that extends the draft), a chain 2 s;
    # from plain the chain's step is priced 2 + 0.5 x (3 - 1) / 4 = 2.25 s (the switch's
    # catch-up, half of it, over the 4 steps a pricing stands for)
    costs = StepCosts(COSTS.buckets, COSTS.seconds, {(b, s): 3.0 for b in (1, 8)
                      for s in (False, True)}, catch_up_every=16)  # fmt: skip
    batch = requests_at([0.0])

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
        assert policy.choose(requests_at([0.0] * 4)) == expected  # from plain, its first shape


def test_drafting_steps_never_explore_plain_however_close_and_untimed() -> None:
    # the chain commits 2.18 tokens in 1.9 s (1.15 a second), plain 1 in 1 s: plain is a close
    # runner-up (within the 20 % margin) never timed, yet a lone plain step among chain steps
    # would teach no time; a tree as close (0.95 a second) is explored instead
    prior = RankProfile(((0.6, 0.3),))
    tree = DraftShape(3, 2, 6)
    tree_tokens = 1 + expected_accepted(tree, prior)
    for shapes, table in (
        ((CHAIN, PLAIN), {CHAIN: 1.9, PLAIN: 1.0}),
        ((CHAIN, tree, PLAIN), {CHAIN: 1.9, tree: tree_tokens / 0.95, PLAIN: 1.0}),
    ):
        policy = AdaptiveShapes(
            shapes, prior=prior, prior_weight=1e9, calibration_weight=1e9, hysteresis=0.0,
            probe_every=1000, explore_every=4, stall_ratio=4.0,
        )  # fmt: skip
        policy.use_costs(costs_of(table), warm_after=0)
        batch = requests_at([0.0])
        ran = [policy.choose(batch) for _ in range(33)]  # nothing timed: untried throughout
        assert PLAIN not in ran
        explored = [step for step, shape in enumerate(ran) if shape != CHAIN]
        assert all(ran[step] == tree for step in explored)
        # two steps after 4 drafting steps, then after 4, 8 and 16 more
        assert explored == ([3, 4, 7, 8, 15, 16, 31, 32] if tree in shapes else [])


def test_a_runner_up_is_explored_ever_more_rarely_until_the_choice_changes() -> None:
    # the chain commits 1.15 tokens a second, the tree 0.95 (within the 20 % margin): the tree
    # is explored after 4, 4, 8, 16, 32 and then every 64 drafting steps (16 x 4); when a new
    # estimate makes the tree the choice and then the chain again, its waits start afresh
    prior = RankProfile(((0.6, 0.3),))
    tree = DraftShape(3, 2, 6)
    tree_tokens = 1 + expected_accepted(tree, prior)
    policy = AdaptiveShapes(
        (CHAIN, tree, PLAIN), prior=prior, prior_weight=1e9, calibration_weight=1e9,
        hysteresis=0.0, probe_every=1000, explore_every=4, stall_ratio=4.0, reprice_every=1,
    )  # fmt: skip
    policy.use_costs(costs_of({CHAIN: 1.9, tree: tree_tokens / 0.95, PLAIN: 1.0}), warm_after=0)
    batch = requests_at([0.0])
    ran = [policy.choose(batch) for _ in range(257)]
    explored = [step + 1 for step, shape in enumerate(ran) if shape == tree]
    # two steps each time: the first, right after a chain step, teaches no time
    assert explored == [n + second for n in (4, 8, 16, 32, 64, 128, 192, 256) for second in (0, 1)]
    costs = policy.costs
    assert costs is not None
    # timed, the tree's steps take half their estimate: it becomes the choice; then as long as
    # the table says: the chain again; once the tree's times are stale (16 steps later), it is
    # explored within 4 drafting steps, not 64
    for seconds in (0.5, 1.0):
        for _ in range(10):  # runs of four steps: the first of each teaches nothing
            for shape, took in ((CHAIN, 1.9), (tree, seconds * tree_tokens / 0.95)):
                for _ in range(4):
                    costs.record(shape, 1, False, took)
        assert policy.choose(batch) == (tree if seconds < 1 else CHAIN)
    for _ in range(16):
        costs.record(CHAIN, 1, False, 1.9)
    assert tree in [policy.choose(batch) for _ in range(4)]
