"""The rank profile learned from committed verify steps (``AcceptanceProfile``): the rates it
is fed, ranks a tree did not offer, the decay, and a chain's own rates along the draft's first
candidates — against hand-computed cases and a direct count."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eagletree.domain.acceptance_profile import AcceptanceProfile
from eagletree.domain.draft_shape import DraftShape, RankProfile, expected_accepted


def test_the_profile_learns_the_rates_it_is_fed_and_ignores_ranks_not_offered() -> None:
    truth: tuple[tuple[float, ...], ...] = ((0.6, 0.2, 0.1), (0.5, 0.25, 0.05))
    tracker = AcceptanceProfile(2, 3, RankProfile(((0.1,),)), prior_weight=1.0, half_life=1e9)
    rng = random.Random(7)
    for _ in range(4000):
        ranks, offered = [], []
        width = rng.choice((1, 2, 3))  # trees of every width: narrower ones censor ranks
        for row in truth:
            offered.append(width)
            rank = _drawn_rank(rng, row)
            if rank >= width:
                rank = -1  # the target's token was not in the tree: the path ends
            ranks.append(rank)
            if rank < 0:
                break
        ranks += [-1] * (2 - len(ranks))
        offered += [0] * (2 - len(offered))
        tracker.record([(ranks, offered)])
    learned = tracker.profile().hit_rates
    for row, expected in zip(learned, truth, strict=True):
        assert row == pytest.approx(expected, abs=0.03)


def test_ranks_offered_only_where_the_draft_is_unsure_do_not_lower_rank_0() -> None:
    # a tree keeps the lower ranks where the draft is unsure: there the target takes rank 0
    # half the time and rank 1 often; where it is sure, only rank 0 is offered (and taken 95 %
    # of the time). Rank 1's hits / exposures (0.3) overstate its rate over all steps (0.09),
    # and the raw row sums past 1: rank 0 must keep its own mean, 0.7·0.95 + 0.3·0.5
    tracker = AcceptanceProfile(1, 3, RankProfile(((0.5,),)), prior_weight=1.0, half_life=1e9)
    rng = random.Random(3)
    for _ in range(6000):
        unsure = rng.random() < 0.3
        rates, width = ((0.5, 0.3, 0.1), 3) if unsure else ((0.95,), 1)
        tracker.record([([_drawn_rank(rng, rates)], [width])])
    (row,) = tracker.profile().hit_rates
    assert row[0] == pytest.approx(0.7 * 0.95 + 0.3 * 0.5, abs=0.02)
    assert sum(row) <= 1.0 + 1e-12
    assert list(row) == sorted(row, reverse=True)  # the draft's ranking: non-increasing
    assert row[1] == pytest.approx(1.0 - row[0], abs=1e-12)  # the excess taken from rank 1
    assert row[2] == 0.0


def test_old_steps_fade_with_the_half_life() -> None:
    tracker = AcceptanceProfile(1, 1, RankProfile(((0.0,),)), prior_weight=0.0, half_life=10)
    for _ in range(200):
        tracker.record([([0], [1])])  # always accepted
    assert tracker.profile().hit_rates[0][0] == pytest.approx(1.0)
    for _ in range(10):
        tracker.record([([-1], [1])])  # never accepted, for one half-life
    # the 200 old hits weigh as much as the 10 new misses' share of the decayed total
    weights = [0.5 ** (i / 10) for i in range(210)]
    hits = sum(weights[10:])
    assert tracker.profile().hit_rates[0][0] == pytest.approx(hits / sum(weights), rel=1e-6)
    assert math.isclose(sum(weights[:10]) / sum(weights), 1 - hits / sum(weights))


def test_more_paths_of_the_same_step_count_as_if_recorded_with_it() -> None:
    prior = RankProfile(((0.5, 0.2), (0.5, 0.2)))
    paths = [([0, 1], [2, 2]), ([1, -1], [2, 2]), ([-1, -1], [2, 0])]
    together = AcceptanceProfile(2, 2, prior, prior_weight=4.0, half_life=2)
    apart = AcceptanceProfile(2, 2, prior, prior_weight=4.0, half_life=2)
    for _ in range(3):  # steps before, which the next step's decay weighs down
        together.record(paths[:1])
        apart.record(paths[:1])
    assert together.record(paths) == 3  # 2 + 1 + 0 drafts
    assert apart.record(paths[:1]) + apart.record(paths[1:], steps=0) == 3
    assert apart.profile() == together.profile()
    apart.record(paths[1:])  # a new step: the old counts decay first
    assert apart.profile() != together.profile()


def test_a_record_of_several_steps_decays_the_counts_by_all_of_them() -> None:
    # one step recorded in three: the counts before it fade as if the two steps between had
    # been recorded too, with no paths
    prior = RankProfile(((0.5, 0.2), (0.5, 0.2)))
    paths = [([0, 1], [2, 2]), ([1, -1], [2, 2]), ([-1, -1], [2, 0])]
    every = AcceptanceProfile(2, 2, prior, prior_weight=4.0, half_life=3)
    one_in_three = AcceptanceProfile(2, 2, prior, prior_weight=4.0, half_life=3)
    for _ in range(4):
        every.record([])
        every.record([])
        every.record(paths[:1])
        every.record(paths[1:], steps=0)
        one_in_three.record(paths, steps=3)
    expected = every.profile()
    for got_row, want_row in zip(one_in_three.profile().hit_rates, expected.hit_rates, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-12)
    assert one_in_three.profile().line_rates == pytest.approx(expected.line_rates, rel=1e-12)
    assert one_in_three.exposures(1, 0) == pytest.approx(every.exposures(1, 0), rel=1e-12)
    with pytest.raises(ValueError, match="steps"):
        one_in_three.record(paths, steps=-1)


def test_the_decay_survives_runs_far_longer_than_a_counts_range() -> None:
    # half-life 1: a new step weighs twice the last, 2^1100 after 1100 steps (past a float's
    # range): the counts are rescaled on the way, and the rates stay the decayed ones
    tracker = AcceptanceProfile(1, 2, RankProfile(((0.5, 0.2),)), prior_weight=4.0, half_life=1)
    # rank 1, none, then rank 0 twice, in a fixed pattern (rank 0 the likelier, as a draft's
    # ranking has it, and the row below 1: the rates are the decayed means themselves)
    outcomes = [(1, 2, 0, 0)[i % 4] for i in range(1100)]
    for outcome in outcomes:
        tracker.record([([outcome if outcome < 2 else -1], [2])])
    weights = [0.5**age for age in range(len(outcomes))]  # newest first
    total = sum(weights)
    for rank in (0, 1):
        hits = sum(w for w, o in zip(weights, reversed(outcomes), strict=True) if o == rank)
        assert tracker.profile().hit_rates[0][rank] == pytest.approx(hits / total, rel=1e-9)
    assert tracker.exposures(0, 0) == pytest.approx(total, rel=1e-9)
    # one depth: the line is every path, rescaled with the rest
    assert tracker.profile().line_rates[0] == pytest.approx(tracker.top_rates()[0], rel=1e-9)


@given(
    steps=st.lists(
        st.lists(
            st.lists(st.tuples(st.integers(-1, 5), st.integers(0, 6)), min_size=1, max_size=5),
            max_size=4,
        ),
        min_size=1,
        max_size=30,
    )
)
def test_the_profile_counts_as_a_walk_over_every_offered_rank_would(
    steps: list[list[list[tuple[int, int]]]],
) -> None:
    # the profile keeps offers per count and sums them when read: against the direct count,
    # each path exposing every rank offered, with the same decay and prior; a depth's rates
    # scaled by the first depth's rank-0 rate over all steps against the steps offering it
    depths, ranks, prior_weight, decay = 3, 4, 2.0, 0.5 ** (1 / 64)
    prior = RankProfile(((0.5, 0.2), (0.6,)))
    tracker = AcceptanceProfile(depths, ranks, prior, prior_weight=prior_weight)
    hits = [[prior_weight * prior.rate(d, j) for j in range(ranks)] for d in range(depths)]
    exposures = [[prior_weight] * ranks for _ in range(depths)]
    # the first depth's rank-0 (hits, exposures): over all steps, and over those offering each
    first_everywhere = [prior_weight * prior.chain_rate(0), prior_weight]
    first_offering = [[prior_weight * prior.chain_rate(0), prior_weight] for _ in range(depths)]
    for step in steps:
        paths = [([r for r, _ in path], [c for _, c in path]) for path in step]
        accepted = tracker.record(paths)
        for row in (*hits, *exposures, first_everywhere, *first_offering):
            row[:] = [count * decay for count in row]
        first = [
            sum(1.0 for taken, offered in paths if offered[0] > 0 and taken[0] == 0),
            sum(1.0 for _, offered in paths if offered[0] > 0),
        ]
        first_everywhere[:] = [a + b for a, b in zip(first_everywhere, first, strict=True)]
        for depth in range(min(max((len(p) for p in step), default=0), depths)):
            first_offering[depth][:] = [
                a + b for a, b in zip(first_offering[depth], first, strict=True)
            ]
        walked = 0
        for taken, offered in paths:
            for depth, (rank, count) in enumerate(zip(taken, offered, strict=True)):
                if depth >= depths or count <= 0:
                    break
                for j in range(min(count, ranks)):
                    exposures[depth][j] += 1.0
                if rank < 0:
                    break
                if rank < ranks:
                    hits[depth][rank] += 1.0
                walked += 1
        assert accepted == walked  # the drafts accepted, depth by depth
    for depth in range(depths):
        for rank in range(ranks):
            assert tracker.exposures(depth, rank) == pytest.approx(exposures[depth][rank])
        top = hits[depth][0] / exposures[depth][0]
        assert tracker.top_rates()[depth] == pytest.approx(top)
        (everywhere_hits, everywhere), (offering_hits, offering) = (
            first_everywhere,
            first_offering[depth],
        )
        scale = everywhere_hits / everywhere * offering / offering_hits
        assert tracker.profile().hit_rates[depth][0] == pytest.approx(min(top * scale, 1.0))


def test_a_chains_rates_count_only_the_paths_that_took_every_first_candidate() -> None:
    # four tree paths over three depths, every depth offering 4 candidates (no prior, no decay)
    tracker = AcceptanceProfile(3, 4, RankProfile(((0.5,),)), prior_weight=0.0, half_life=1e12)
    tracker.record(
        [
            ((0, 0, -1), (4, 4, 4)),  # on the line through depth 2, missed at depth 3
            ((1, 0, 0), (4, 4, 4)),  # off the line at depth 1: rank 0 after that is not a chain's
            ((1, -1, -1), (4, 4, 0)),
            ((0, 1, 0), (4, 4, 4)),  # off the line at depth 2
        ]
    )
    profile = tracker.profile()
    # rank 0 over every path that reached the depth: 2/4, 2/4 (paths 1 and 2 of 4), 2/3
    assert [row[0] for row in profile.hit_rates] == pytest.approx([0.5, 0.5, 2 / 3])
    # along the line: depth 1 as above; depth 2 reached on the line by paths 1 and 4, taken by
    # path 1; depth 3 reached on the line by path 1 alone, missed
    assert profile.line_rates == pytest.approx((0.5, 0.5, 0.0))
    assert expected_accepted(DraftShape.chain(3), profile) == pytest.approx(0.5 + 0.25)
    # a tree prices its nodes by the rank rates
    tree = DraftShape(3, 2, 7)
    assert expected_accepted(tree, profile) == pytest.approx(
        expected_accepted(tree, RankProfile(profile.hit_rates))
    )


def test_tree_steps_learn_the_chain_their_first_candidates_draft() -> None:
    # the text is easy where the draft's first candidates keep being taken: 0.9 a depth on the
    # line, 0.5 after a path took a lower candidate. A chain of those steps' rank-0 rates would
    # be priced too low; its line rates price it as a chain's own steps would
    depths, line_rate, off_line_rate, second = 5, 0.9, 0.5, 0.08
    tracker = AcceptanceProfile(depths, 4, RankProfile(((0.5,),)), prior_weight=1.0, half_life=1e9)
    rng = random.Random(11)
    for _ in range(3000):
        ranks, on_line = [], True
        for _depth in range(depths):
            rank = _drawn_rank(rng, (line_rate if on_line else off_line_rate, second))
            ranks.append(rank)
            if rank < 0:
                break
            on_line = on_line and rank == 0
        ranks += [-1] * (depths - len(ranks))
        offered = [4 if i == 0 or ranks[i - 1] >= 0 else 0 for i in range(depths)]
        tracker.record([(ranks, offered)])
    profile = tracker.profile()
    chain = DraftShape.chain(depths)
    truth = sum(line_rate**d for d in range(1, depths + 1))
    assert expected_accepted(chain, profile) == pytest.approx(truth, rel=0.03)
    # rank 0 over every path: 0.87 at depth 2 (8 % of the paths there are off the line), less
    # deeper — about 6 % fewer drafts than the chain accepts
    assert expected_accepted(chain, RankProfile(profile.hit_rates)) < 0.96 * truth


def _drawn_rank(rng: random.Random, rates: tuple[float, ...]) -> int:
    """The rank the target takes, drawn by ``rates`` (−1: none of them)."""
    draw = rng.random()
    for rank, rate in enumerate(rates):
        draw -= rate
        if draw < 0:
            return rank
    return -1


def test_depths_seen_only_in_easy_steps_are_priced_by_every_steps_first_depth() -> None:
    # a policy drafted chain S3 through a hard stretch and chain S5 through an easy one: the
    # deep depths, seen in the S5 steps alone, are scaled by the first depth's rate over all
    # steps (15 of 20 taken) against the S5 steps' own (10 of 10)
    tracker = AcceptanceProfile(5, 1, RankProfile(((0.5,),)), prior_weight=0.0, half_life=1e12)
    hard = [([0, 0, 0], [1, 1, 1])] * 5 + [([-1, -1, -1], [1, 0, 0])] * 5
    easy = [([0, 0, 0, 0, 0], [1] * 5)] * 8 + [([0, 0, 0, -1, -1], [1, 1, 1, 1, 0])] * 2
    for path in hard + easy:
        tracker.record([path])
    profile = tracker.profile()
    # depths 1–3 were offered by every step: their own rates; 4 and 5 at 0.75 of theirs
    assert profile.line_rates == pytest.approx((0.75, 1.0, 1.0, 0.8 * 0.75, 1.0 * 0.75))
    assert [row[0] for row in profile.hit_rates] == pytest.approx(profile.line_rates)
    assert tracker.top_rates() == pytest.approx([0.75, 1.0, 1.0, 0.8, 1.0])  # the raw rates
    # where the deep steps' first depth was no easier than the rest, nothing is scaled
    even = AcceptanceProfile(5, 1, RankProfile(((0.5,),)), prior_weight=0.0, half_life=1e12)
    for path in hard + [([0, 0, 0, 0, 0], [1] * 5)] * 5 + [([-1] * 5, [1, 0, 0, 0, 0])] * 5:
        even.record([path])
    assert even.profile().line_rates == pytest.approx(even.top_rates())
