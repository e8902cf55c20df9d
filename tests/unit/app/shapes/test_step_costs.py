"""The costs an adaptive policy prices shapes by, as the running engine corrects them: a shape
that ran is priced by what its steps took, one that has not by its measured time plus the
excess the steps of its kind (plain, drafting) showed at its bucket and sampling; read-back
intervals time a step only after its predecessor's read-back."""

from __future__ import annotations

import pytest

from eagletree.app.workers.shapes.learned_costs import LearnedCosts
from eagletree.app.workers.shapes.step_costs import ReadBackClock, StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape

CHAIN = DraftShape.chain(3)
TREE = DraftShape(3, 2, 6)
SHAPES = (PLAIN, CHAIN, TREE)
BUCKETS = (1, 8)
# measured (replayed) seconds: plain 1, chain 2, tree 3 at bucket 1; twice that at bucket 8;
# sampled steps 0.5 more
MEASURED = StepCosts(
    BUCKETS,
    {(s, b, sampled): (1 + SHAPES.index(s)) * (1 if b == 1 else 2) + 0.5 * sampled
     for s in SHAPES for b in BUCKETS for sampled in (False, True)},
)  # fmt: skip


def test_before_any_step_the_measured_table_prices_every_shape() -> None:
    costs = LearnedCosts(MEASURED)
    for (shape, bucket, sampled), seconds in MEASURED.seconds.items():
        assert costs.of(shape, bucket, sampled) == seconds
    assert costs.of(CHAIN, 5, False) == 4.0  # bucket 8
    assert costs.of(CHAIN, 16, False) == 8.0  # past it: bucket 8's, scaled by the rows


def test_a_shape_that_ran_is_priced_by_its_steps_and_the_others_by_their_excess() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5)
    costs.record(PLAIN, 1, False, 2.0)  # the host's work: a plain step took 1 s more
    # plain: its estimate (1) as one sample, then 2: the mean 1.5
    assert costs.of(PLAIN, 1, False) == pytest.approx(1.5)
    # unobserved shapes at that bucket and sampling pay the excess seen there (2 − 1)
    assert costs.of(CHAIN, 1, False) == pytest.approx(3.0)
    assert costs.of(TREE, 1, False) == pytest.approx(4.0)
    # the other sampling is untouched
    assert costs.of(CHAIN, 1, True) == 2.5
    costs.record(CHAIN, 1, False, 2.0)  # the chain was cheaper than its estimate (3)
    assert costs.of(CHAIN, 1, False) == pytest.approx(2.5)
    # a drafting step ran: the tree pays the drafting steps' excess, the chain's 0 (2 − 2)
    assert costs.of(TREE, 1, False) == pytest.approx(3.0)


def test_plain_steps_are_priced_by_the_excess_of_plain_steps_not_of_drafting_ones() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5)
    costs.record(CHAIN, 1, False, 4.0)  # a drafting step's host work: 2 s over its table
    # no plain step ran anywhere: plain is priced by its table alone (too low is corrected
    # when it runs; too high would never be, as nothing would choose it)
    assert costs.of(PLAIN, 1, False) == pytest.approx(1.0)
    costs.record(PLAIN, 8, False, 9.0)  # right after a drafting step: paid its host work
    assert costs.of(PLAIN, 1, False) == pytest.approx(1.0)
    costs.record(PLAIN, 8, False, 2.25)  # a plain step at bucket 8: 0.25 s over its table
    # now bucket 1's plain steps borrow that, not the drafting excess seen at their bucket
    assert costs.of(PLAIN, 1, False) == pytest.approx(1.0 + 0.25)
    assert costs.of(TREE, 1, False) == pytest.approx(3.0 + 2.0)
    assert costs.of(TREE, 8, False) == pytest.approx(6.0 + 2.0)  # its kind's, a bucket away


def test_a_bucket_where_nothing_ran_borrows_the_nearest_buckets_excess() -> None:
    buckets = (1, 8, 16, 32)
    measured = StepCosts(
        buckets,
        {(s, b, sampled): 1.0 + SHAPES.index(s) for s in SHAPES for b in buckets
         for sampled in (False, True)},
    )  # fmt: skip
    costs = LearnedCosts(measured, warm_after=0, weight=0.5)
    costs.record(PLAIN, 32, False, 3.0)  # excess 2.0 at bucket 32
    assert costs.of(CHAIN, 8, False) == pytest.approx(2.0 + 2.0)  # the only one seen
    costs.record(PLAIN, 1, False, 1.5)  # excess 0.5 at bucket 1
    assert costs.of(CHAIN, 8, False) == pytest.approx(2.0 + 0.5)  # 1 is nearer than 32
    assert costs.of(CHAIN, 24, False) == pytest.approx(2.0 + 2.0)  # bucket 32
    # nothing sampled ran: a drafting shape takes its kind's unsampled excess (none yet), else
    # plain's sampled (none): its table
    assert costs.of(CHAIN, 16, True) == 2.0
    costs.record(TREE, 16, False, 4.0)  # a drafting step: bucket 16 has one of its kind, 1.0
    assert costs.of(CHAIN, 16, False) == pytest.approx(2.0 + 1.0)
    # a drafting step's kind before a nearer bucket's other kind (plain's 0.5 at bucket 1)
    assert costs.of(CHAIN, 8, False) == pytest.approx(2.0 + 1.0)
    assert costs.of(PLAIN, 8, False) == pytest.approx(1.0 + 0.5)  # 8 − 1 < 16 − 8


def test_a_table_that_overstates_never_prices_a_step_at_nothing_or_less() -> None:
    # bucket 8's plain steps take 0.1 s against a table's 2 (excess -1.9): bucket 1's plain
    # step (table 1 s) and chain (2 s) would borrow it whole and cost -0.9 and 0.1 s
    costs = LearnedCosts(MEASURED, warm_after=0, weight=1.0)
    costs.record(PLAIN, 8, False, 0.1)
    costs.record(PLAIN, 8, False, 0.1)
    assert costs.of(PLAIN, 8, False) == pytest.approx(0.1)  # its own steps: as they ran
    assert costs.of(PLAIN, 1, False) == pytest.approx(0.25 * 1.0)  # a quarter of the table
    assert costs.of(CHAIN, 1, False) == pytest.approx(0.25 * 2.0)
    assert costs.of(TREE, 1, False) == pytest.approx(3.0 - 1.9)  # above its floor: whole


def test_repeated_steps_converge_on_what_they_take() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.2)
    for _ in range(60):
        costs.record(CHAIN, 8, True, 7.0)
    assert costs.of(CHAIN, 8, True) == pytest.approx(7.0, rel=1e-3)
    assert costs.of(TREE, 8, True) == pytest.approx(6.5 + (7.0 - 4.5), rel=1e-3)
    assert costs.of(PLAIN, 8, True) == 2.5  # no plain step ran: not the drafting excess


def test_a_kind_seen_only_with_the_other_sampling_lends_its_excess_across() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5)
    costs.record(PLAIN, 8, False, 2.5)  # unsampled plain: 0.5 over its table (2)
    costs.record(CHAIN, 8, True, 6.5)  # sampled drafting: 2 over its table (4.5)
    assert costs.of(PLAIN, 8, True) == pytest.approx(2.5 + 0.5)  # plain's, unsampled
    assert costs.of(TREE, 8, False) == pytest.approx(6.0 + 2.0)  # drafting's, sampled
    costs.record(PLAIN, 8, True, 2.75)  # after the chain's: taught nothing
    assert costs.of(PLAIN, 8, True) == pytest.approx(2.5 + 0.5)
    costs.record(PLAIN, 8, True, 2.75)  # now a sampled plain step: its own kind and sampling
    assert costs.of(PLAIN, 1, True) == pytest.approx(1.5 + 0.25)


def test_a_step_far_longer_than_its_estimate_counts_as_clip_times_it() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5, clip=3.0)
    costs.record(PLAIN, 1, False, 1000.0)  # the engine waited: counts as 3 (3 x 1)
    assert costs.of(PLAIN, 1, False) == pytest.approx((1.0 + 3.0) / 2)


def test_past_the_largest_bucket_steps_are_recorded_and_priced_per_row() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5)
    costs.record(CHAIN, 16, False, 16.0)  # 8 per bucket-8 step; its estimate there: 4
    assert costs.of(CHAIN, 8, False) == pytest.approx(6.0)
    assert costs.of(CHAIN, 16, False) == pytest.approx(12.0)


def test_the_first_steps_at_a_bucket_and_sampling_teach_nothing_but_their_median() -> None:
    costs = LearnedCosts(MEASURED, weight=0.5, warm_after=3)
    for _ in range(3):
        costs.record(PLAIN, 1, False, 3.0)  # a cold engine's: 2 s over the table
    assert costs.of(PLAIN, 1, False) == 1.0  # the table's
    assert costs.of(CHAIN, 1, False) == 2.0  # no excess to lend
    assert costs.observations(PLAIN, 1, False) == 0
    assert costs.median_step(1, False) == 3.0
    costs.record(PLAIN, 1, False, 1.5)  # warm: its estimate (1) as one sample, then 1.5
    assert costs.of(PLAIN, 1, False) == pytest.approx(1.25)
    assert costs.observations(PLAIN, 1, False) == 1
    # the other sampling warms up on its own steps, and borrows meanwhile
    costs.record(PLAIN, 1, True, 9.0)
    assert costs.of(PLAIN, 1, True) == pytest.approx(1.5 + 0.5)
    assert costs.observations(PLAIN, 1, True) == 0


def test_a_plain_step_right_after_a_drafting_one_teaches_nothing() -> None:
    # on the H100 at T 1, bs 1 lone plain steps among chain steps read back 0.66-0.94 ms where
    # a run of plain steps took 0.45: a lone step's interval pays the chain step's host work
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5)
    for _ in range(4):
        for _ in range(15):
            costs.record(CHAIN, 1, True, 2.5)  # as its table says
        costs.record(PLAIN, 1, True, 2.5)  # a lone plain step, 1 s over its table
    assert costs.observations(PLAIN, 1, True) == 0
    assert costs.of(PLAIN, 1, True) == 1.5  # its table still
    assert costs.of(PLAIN, 8, True) == 2.5  # and nothing lent
    for _ in range(6):
        costs.record(PLAIN, 1, True, 1.75)  # a run of plain steps after the last lone one: each
    assert costs.observations(PLAIN, 1, True) == 6
    assert costs.of(PLAIN, 1, True) == pytest.approx(1.75, abs=0.02)
    assert costs.of(PLAIN, 8, True) == pytest.approx(2.5 + 0.25, abs=0.02)


def test_a_drafting_step_right_after_one_of_another_shape_teaches_nothing() -> None:
    # with overlap, where the host loop is the bottleneck, a step's read-back interval carries
    # part of the host work of the step before: on the H100 at T 1, bs 32 chain S1 steps right
    # after chain S2 ones took 0.771 ms, after chain S1 ones 0.697, and an adaptive engine
    # switching between them priced chain S1 6 % over its time
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5)
    for _ in range(4):
        for _ in range(3):
            costs.record(TREE, 1, False, 3.0)  # as its table says
        costs.record(CHAIN, 1, False, 5.0)  # a lone chain step, 3 s over its table
    assert costs.observations(CHAIN, 1, False) == 0
    assert costs.of(CHAIN, 1, False) == 2.0  # its table, and the tree's excess (0)
    assert costs.observations(TREE, 1, False) == 3 + 3 * 2  # runs after the first: 2 steps each
    costs.record(CHAIN, 1, False, 2.5)  # the first chain step after a chain step
    assert costs.observations(CHAIN, 1, False) == 1
    assert costs.of(CHAIN, 1, False) == pytest.approx((2.0 + 2.5) / 2)
    costs.record(PLAIN, 1, False, 4.0)  # a plain step right after a drafting one, as before
    costs.record(CHAIN, 1, False, 4.0)  # a drafting step after a plain one still teaches
    assert costs.observations(PLAIN, 1, False) == 0
    assert costs.observations(CHAIN, 1, False) == 2


# catch-ups: 5 s at every bucket and sampling, one every 4 plain steps
WITH_CATCH_UP = StepCosts(
    BUCKETS,
    MEASURED.seconds,
    {(b, sampled): 5.0 for b in BUCKETS for sampled in (False, True)},
    catch_up_every=4,
)


def test_a_plain_step_is_priced_as_its_share_of_a_run_with_its_catch_ups() -> None:
    costs = LearnedCosts(WITH_CATCH_UP, warm_after=0, weight=0.5)
    # three plain steps of 1 s and a catch-up of 5 s per 4 tokens
    assert costs.of(PLAIN, 1, False) == pytest.approx((3 * 1.0 + 5.0) / 4)
    assert costs.measured_of(PLAIN, 1, False) == pytest.approx(2.0)
    assert costs.of(CHAIN, 1, False) == 2.0  # drafting steps need no catch-up


def test_catch_ups_are_learned_apart_from_the_plain_steps_of_a_run() -> None:
    costs = LearnedCosts(WITH_CATCH_UP, warm_after=0, weight=0.5)
    for _ in range(30):
        costs.record(PLAIN, 8, False, 11.0, catch_up=True)  # 6 s more than measured
    # plain steps that leave their token in the lag were not timed: measured + the excess
    assert costs.observations(PLAIN, 8, False) == 0
    assert costs.of(PLAIN, 8, False) == pytest.approx((3 * (2.0 + 6.0) + 11.0) / 4, rel=1e-3)
    for _ in range(30):
        costs.record(PLAIN, 8, False, 2.5)
    # each kind priced by its own steps: a catch-up's time is not a plain step's
    assert costs.observations(PLAIN, 8, False) == 30
    assert costs.of(PLAIN, 8, False) == pytest.approx((3 * 2.5 + 11.0) / 4, rel=1e-3)
    assert costs.measured_of(PLAIN, 8, False) == pytest.approx((3 * 2.0 + 5.0) / 4)


def test_a_shape_that_stopped_running_is_priced_by_the_table_and_the_excess_again() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.5, stale_after=10)
    for _ in range(5):
        costs.record(CHAIN, 8, False, 12.0)  # steps that paid another's work: 3 × 4
    assert costs.of(CHAIN, 8, False) == pytest.approx(12.0, rel=0.1)
    assert costs.observations(CHAIN, 8, False) == 5
    for _ in range(9):
        costs.record(TREE, 8, False, 7.0)  # the tree runs, at 1 s over its table's 6
    assert costs.of(CHAIN, 8, False) == pytest.approx(12.0, rel=0.1)  # 9 < 10: still its own
    costs.record(TREE, 8, False, 7.0)
    # stale: the chain's table (4) plus the excess the steps at bucket 8 show now (about 1)
    assert costs.observations(CHAIN, 8, False) == 0
    assert costs.of(CHAIN, 8, False) == pytest.approx(4.0 + 1.0, abs=0.05)
    # its next step, right after a tree step, teaches nothing (it paid part of the tree's
    # host work); the one after starts a new average from that estimate, not the stale one
    costs.record(CHAIN, 8, False, 9.0)
    assert costs.observations(CHAIN, 8, False) == 0
    costs.record(CHAIN, 8, False, 5.0)
    assert costs.observations(CHAIN, 8, False) == 1
    assert costs.of(CHAIN, 8, False) == pytest.approx(5.0, abs=0.05)


class FakeClock:
    def __init__(self, times: list[float]) -> None:
        self._times = iter(times)

    def __call__(self) -> float:
        return next(self._times)


def test_read_back_intervals_time_a_step_only_after_its_predecessor() -> None:
    clock = ReadBackClock(FakeClock([10.0, 10.5, 11.25, 20.0, 20.5]))
    assert clock.lap(1) is None  # nothing read back before
    assert clock.lap(2) == 0.5
    assert clock.lap(3) == 0.75
    assert clock.lap(5) is None  # step 4 (a prefill alone) was not read back here
    assert clock.lap(6) == 0.5


def test_a_catch_ups_excess_over_a_plain_step_follows_both_as_they_run() -> None:
    with_catch_ups = StepCosts(
        BUCKETS, MEASURED.seconds, {(b, s): 4.0 * b for b in BUCKETS for s in (False, True)}, 16
    )
    costs = LearnedCosts(with_catch_ups, warm_after=0, weight=0.5)
    assert costs.catch_up_excess(1, False) == pytest.approx(4.0 - 1.0)  # the tables'
    assert costs.catch_up_excess(8, True) == pytest.approx(32.0 - 2.5)
    assert costs.catch_up_excess(16, True) == pytest.approx(2 * (32.0 - 2.5))  # per row past 8
    costs.record(PLAIN, 1, False, 2.0)  # a plain step took 2: its mean 1.5
    # a catch-up took 6: its estimate (its table's 4 + the plain excess 1) as one sample, then
    # 6: the mean 5.5
    costs.record(PLAIN, 1, False, 6.0, catch_up=True)
    assert costs.catch_up_excess(1, False) == pytest.approx(5.5 - 1.5)
    assert LearnedCosts(MEASURED).catch_up_excess(8, False) == 0.0  # plain steps need none


def test_the_median_step_is_that_of_the_last_steps_of_any_shape() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, recent_steps=4)
    assert costs.median_step(1, False) is None
    for shape, seconds in ((CHAIN, 2.0), (TREE, 3.0), (TREE, 3.0), (PLAIN, 1.0)):
        costs.record(shape, 1, False, seconds)
    assert costs.median_step(1, False) == 3.0  # of 1, 2, 3, 3: the upper middle
    assert costs.median_step(1, True) is None  # the other sampling: nothing yet
    for _ in range(2):  # the batch turned to plain steps: three of the last four
        costs.record(PLAIN, 1, False, 1.0)
    assert costs.median_step(1, False) == 1.0  # the tree steps before them are gone


def test_a_bucket_without_steps_yet_has_the_median_of_the_nearest_smaller_one() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, recent_steps=4)
    for seconds in (2.0, 3.0, 4.0):
        costs.record(CHAIN, 1, False, seconds)
    # bucket 8 ran nothing: bucket 1's median, per row past bucket 8 as a step there
    assert costs.median_step(8, False) == 3.0
    assert costs.median_step(16, False) == 6.0
    for seconds in (5.0, 7.0, 7.0):
        costs.record(CHAIN, 8, False, seconds)
    assert costs.median_step(8, False) == 7.0  # its own steps once it has some
    fresh = LearnedCosts(MEASURED, warm_after=0)
    fresh.record(CHAIN, 8, False, 5.0)
    assert fresh.median_step(1, False) is None  # a larger batch's steps say nothing of it


def test_steps_while_the_host_stalls_teach_nothing_of_what_a_shape_costs() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.1, stall_over=1.5)
    for _ in range(20):
        costs.record(CHAIN, 8, False, 5.0)  # 1 s over its table's 4
    chain, tree = costs.of(CHAIN, 8, False), costs.of(TREE, 8, False)
    assert chain == pytest.approx(5.0, rel=0.01)
    assert tree == pytest.approx(6.0 + 1.0)
    for seconds in (12.0, 20.0, 9.0, 16.0, 11.0, 15.0, 8.0, 20.0, 13.0, 10.0):  # 1.6-4 x
        costs.record(CHAIN, 8, False, seconds)
    # neither its own average nor the excess its kind lends the tree moved; it still ran
    assert (costs.of(CHAIN, 8, False), costs.of(TREE, 8, False)) == (chain, tree)
    assert costs.observations(CHAIN, 8, False) == 20
    assert costs.median_step(8, False) == 5.0  # (the median saw them: 10 of the last 30)


def test_a_young_average_learns_a_cost_far_above_its_estimate() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.1, stall_over=1.5)
    for _ in range(10):
        costs.record(PLAIN, 8, False, 2.0)  # as its table says: the median step 2
    for _ in range(5):
        costs.record(TREE, 8, False, 15.0)  # 2.5 x its table's 6, 7.5 x the median
    # the plain mean of its estimate and its five steps, none taken for a stall
    assert costs.of(TREE, 8, False) == pytest.approx((6.0 + 5 * 15.0) / 6)


def test_a_lasting_rise_in_a_shapes_steps_is_followed() -> None:
    costs = LearnedCosts(MEASURED, warm_after=0, weight=0.1, stall_over=1.5)
    for _ in range(20):
        costs.record(CHAIN, 8, False, 4.0)
    for _ in range(60):
        costs.record(CHAIN, 8, False, 5.6)  # 1.4 x: longer contexts, a busier host
    assert costs.of(CHAIN, 8, False) == pytest.approx(5.6, rel=0.01)


@pytest.mark.parametrize("young", [False, True])
def test_a_pause_read_back_on_a_cheap_step_among_dear_ones_teaches_nothing(young: bool) -> None:
    costs = LearnedCosts(
        MEASURED, warm_after=0, weight=0.1, stall_over=1.5, clip=3.0, stale_after=64
    )
    for _ in range(1 if young else 5):
        costs.record(PLAIN, 8, False, 2.0)  # as its table says
    for _ in range(20):
        costs.record(CHAIN, 8, False, 5.0)  # the median step: 5
    plain, tree = costs.of(PLAIN, 8, False), costs.of(TREE, 8, False)
    # a caller that paused before the read-back: clipped, the step would count as 6 (3 x its
    # average), within 1.5 x the median, and raise both the plain steps' and their excess
    costs.record(PLAIN, 8, False, 1000.0)
    assert (costs.of(PLAIN, 8, False), costs.of(TREE, 8, False)) == (plain, tree)
    # 2.4 x the median: a stall to an average of five steps, a cost an estimate may have
    # missed to a young one (within the clip, 3 x)
    costs.record(PLAIN, 8, False, 12.0)
    assert (costs.of(PLAIN, 8, False) > plain) is young
