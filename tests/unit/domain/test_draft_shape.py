"""Draft shapes, the tokens a shape is expected to commit under a rank profile, and the choice
of a batch's shape from measured step times — against hand-computed cases and invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eagletree.domain.draft_shape import (
    MAX_LAG,
    PLAIN,
    DraftShape,
    RankProfile,
    choose_shape,
    draft_lag_width,
    expected_accepted,
    mean_profile,
    reserved_slots,
    tree_rank_paths,
    with_lower_ranks,
)


def test_shapes_that_cannot_be_drafted_are_refused_naming_the_shape() -> None:
    with pytest.raises(ValueError, match="plain decoding"):
        DraftShape(0, 2, 1)
    with pytest.raises(ValueError, match="chain of depth 3 verifies 4 nodes"):
        DraftShape(3, 1, 6)
    with pytest.raises(ValueError, match=r"tree S2 k2 N8: N - 1 = 7 exceeds the 6 candidates"):
        DraftShape(2, 2, 8)
    with pytest.raises(ValueError, match="S >= 1"):
        DraftShape(1, 0, 2)
    assert DraftShape.chain(5) == DraftShape(5, 1, 6)
    assert [s.label for s in (PLAIN, DraftShape.chain(3), DraftShape(5, 4, 8))] == [
        "plain",
        "chain S3",
        "tree S5 k4 N8",
    ]
    assert (
        PLAIN.tokens_per_step,
        DraftShape.chain(3).tokens_per_step,
        DraftShape(6, 8, 4).tokens_per_step,
    ) == (
        1,
        4,
        4,
    )


def test_a_chain_expects_the_sum_of_its_prefix_products() -> None:
    profile = RankProfile(((0.8,), (0.7,), (0.6,)))
    # 0.8 + 0.8·0.7 + 0.8·0.7·0.6
    assert expected_accepted(DraftShape.chain(3), profile) == pytest.approx(1.696)
    # a depth past the profile repeats its last row: + 0.336·0.6
    assert expected_accepted(DraftShape.chain(4), profile) == pytest.approx(1.696 + 0.2016)
    assert expected_accepted(PLAIN, profile) == 0.0


def test_a_tree_keeps_the_best_nodes_of_its_beam() -> None:
    profile = RankProfile(((0.6, 0.3), (0.5, 0.2)))
    # depth 1: (0) 0.6, (1) 0.3; depth 2: (0,0) 0.3, (0,1) 0.12, (1,0) 0.15, (1,1) 0.06
    nodes = tree_rank_paths(DraftShape(2, 2, 4), profile)
    assert [path for _, path in nodes] == [(0,), (1,), (0, 0)]  # the tie goes to the shallower
    assert expected_accepted(DraftShape(2, 2, 4), profile) == pytest.approx(1.2)
    assert expected_accepted(DraftShape(2, 2, 7), profile) == pytest.approx(
        1.2 + 0.15 + 0.12 + 0.06
    )


def test_the_beam_expands_only_its_k_best_paths() -> None:
    profile = RankProfile(((0.5, 0.2), (0.9, 0.05)))
    # every candidate a depth-3, width-2 beam drafts: 2 + 4 + 4
    paths = [path for _, path in tree_rank_paths(DraftShape(3, 2, 11), profile)]
    assert len(paths) == 10
    # the beam after depth 2 holds (0,0) 0.45 and (1,0) 0.18: depth 3 grows from those only,
    # though (0,1,0) = 0.0225 would beat (1,0,1) = 0.009 if (0,1) had stayed in the beam
    assert {p[:2] for p in paths if len(p) == 3} == {(0, 0), (1, 0)}


def test_ranks_past_a_row_continue_its_last_ratio_within_what_is_left() -> None:
    profile = RankProfile(((0.4, 0.2),))
    assert profile.rate(0, 2) == pytest.approx(0.1)
    assert profile.rate(0, 3) == pytest.approx(0.05)
    assert profile.rate(5, 1) == pytest.approx(0.2)  # deeper: the last row
    crowded = RankProfile(((0.5, 0.45),))
    assert crowded.rate(0, 2) == pytest.approx(0.05)  # capped by the unclaimed probability


def test_a_profile_with_rates_that_are_not_probabilities_is_refused() -> None:
    with pytest.raises(ValueError, match="depth 1"):
        RankProfile(((0.7, 0.5),))
    with pytest.raises(ValueError, match="at least one rate"):
        RankProfile(((0.5,), ()))
    with pytest.raises(ValueError, match="line rates"):
        RankProfile(((0.5,),), (0.9, 1.2))


@given(
    rates=st.lists(st.lists(st.floats(0.0, 0.25), min_size=1, max_size=4), min_size=1, max_size=5),
    num_steps=st.integers(1, 6),
    topk=st.integers(1, 4),
    data=st.data(),
)
def test_more_verified_nodes_never_expect_fewer_tokens(
    rates: list[list[float]], num_steps: int, topk: int, data: st.DataObject
) -> None:
    profile = RankProfile(tuple(tuple(row) for row in rates))
    most = topk + (num_steps - 1) * topk * topk
    if topk == 1:
        shapes = [DraftShape.chain(num_steps)]
    else:
        n = data.draw(st.integers(2, most))
        shapes = [DraftShape(num_steps, topk, n), DraftShape(num_steps, topk, min(n + 1, most + 1))]
    values = [expected_accepted(shape, profile) for shape in shapes]
    assert values == sorted(values)
    assert all(0.0 <= v <= num_steps for v in values)
    nodes = tree_rank_paths(shapes[-1], profile)
    # ancestor-closed: every node's parent path is a node too
    paths = {path for _, path in nodes}
    assert all(len(p) == 1 or p[:-1] in paths for p in paths)


@given(
    rates=st.lists(
        st.lists(
            st.sampled_from([0.0, 0.03, 0.06, 0.12]) | st.floats(0.0, 0.12), max_size=8
        ).filter(bool),
        min_size=1,
        max_size=6,
    ),
    num_steps=st.integers(1, 7),
    topk=st.integers(1, 8),
    data=st.data(),
)
def test_the_expected_drafts_are_the_sum_of_the_trees_node_scores(
    rates: list[list[float]], num_steps: int, topk: int, data: st.DataObject
) -> None:
    # the sum is computed on scores alone; tied scores (drawn often here) must not change it
    profile = RankProfile(tuple(tuple(row) for row in rates))
    most = topk + (num_steps - 1) * topk * topk
    n = num_steps + 1 if topk == 1 else data.draw(st.integers(2, most + 1))
    shape = DraftShape(num_steps, topk, n)
    nodes = tree_rank_paths(shape, profile)
    assert expected_accepted(shape, profile) == pytest.approx(
        math.fsum(score for score, _ in nodes), rel=1e-12, abs=1e-15
    )


def test_the_choice_is_the_fastest_in_committed_tokens_per_second() -> None:
    candidates = [PLAIN, DraftShape.chain(3), DraftShape(5, 4, 8)]
    seconds = [1.0, 1.5, 2.0]
    # two requests; per request: accepted drafts under each shape
    accepted = [[0.0, 0.0], [1.7, 1.3], [2.2, 2.0]]
    choice = choose_shape(candidates, seconds, accepted)
    # plain 2 / 1.0 = 2.0; chain (2.7 + 2.3) / 1.5 = 3.33; tree (3.2 + 3.0) / 2.0 = 3.1
    assert choice.shape == DraftShape.chain(3)
    assert choice.tokens_per_second == pytest.approx(5.0 / 1.5)
    # the tree is 7 % slower than the chain: kept while it is the current shape under 10 %
    kept = choose_shape(candidates, seconds, accepted, current=DraftShape(5, 4, 8), hysteresis=0.1)
    assert kept.shape == DraftShape(5, 4, 8)
    moved = choose_shape(
        candidates, seconds, accepted, current=DraftShape(5, 4, 8), hysteresis=0.05
    )
    assert moved.shape == DraftShape.chain(3)
    # when nothing is accepted, plain decoding wins
    assert choose_shape(candidates, seconds, [[0.0], [0.0], [0.0]]).shape == PLAIN
    with pytest.raises(ValueError, match="one step time"):
        choose_shape(candidates, seconds[:2], accepted)


def test_groups_of_alike_requests_weigh_as_their_counts() -> None:
    candidates = [PLAIN, DraftShape.chain(3)]
    seconds = [1.0, 2.0]
    # greedy requests accept 1.5 drafts under the chain, hot ones none: the chain commits
    # (2.5 g + h) / 2 tokens per second against plain's g + h, so it wins when g > 2 h
    accepted = [[0.0, 0.0], [1.5, 0.0]]
    few_greedy = choose_shape(candidates, seconds, accepted, counts=[1, 3])
    assert few_greedy == choose_shape(candidates, seconds, [[0.0] * 4, [1.5, 0.0, 0.0, 0.0]])
    assert few_greedy.shape == PLAIN and few_greedy.tokens_per_second == pytest.approx(4.0)
    many_greedy = choose_shape(candidates, seconds, accepted, counts=[9, 1])
    assert many_greedy.shape == DraftShape.chain(3)
    assert many_greedy.tokens_per_second == pytest.approx((9 * 2.5 + 1) / 2.0)


def test_the_mean_of_two_profiles_is_taken_rank_by_rank_over_what_either_lists() -> None:
    cold = RankProfile(((0.8, 0.1, 0.05), (0.7,)))
    hot = RankProfile(((0.4, 0.2),))
    mean = mean_profile(cold, hot)
    # depth 1: hot's third rank extrapolated by its ratio: 0.2 x (0.2 / 0.4)
    assert mean.hit_rates[0] == pytest.approx((0.6, 0.15, 0.5 * (0.05 + 0.1)))
    # depth 2: hot repeats its last row; cold's one rank has no ratio to extrapolate (0)
    assert mean.hit_rates[1] == pytest.approx((0.55, 0.1))
    assert mean_profile(cold, cold) == cold
    # a chain's line rates, where either has them (the other's rank 0 standing in), over the
    # depths either lists
    lined = RankProfile(((0.8,),), (0.9, 0.85))
    assert mean_profile(lined, hot).line_rates == pytest.approx((0.65, 0.625))
    assert mean_profile(cold, hot).line_rates == ()


def test_a_profile_of_the_first_ranks_takes_the_lower_ones_from_another_scaled_to_fit() -> None:
    drawn = RankProfile(((0.6, 0.2), (0.9,)))
    top_k = RankProfile(((0.5, 0.15, 0.1, 0.05),))
    widened = with_lower_ranks(drawn, top_k)
    # depth 1: the measured two, then top-k's ranks 3 and 4 (0.15 of the 0.2 left)
    assert widened.hit_rates[0] == pytest.approx((0.6, 0.2, 0.1, 0.05))
    # depth 2: 0.1 left for top-k's three lower ranks (0.3): each scaled by 1/3
    assert widened.hit_rates[1] == pytest.approx((0.9, 0.05, 0.1 / 3, 0.05 / 3))
    # nothing beyond the measured ranks: top-k's row at both of drawn's depths
    assert with_lower_ranks(top_k, drawn).hit_rates == (top_k.hit_rates[0],) * 2
    # the first profile's chain stays its own
    lined = RankProfile(drawn.hit_rates, (0.7, 0.95))
    assert with_lower_ranks(lined, top_k).line_rates == (0.7, 0.95)


def test_the_reserve_holds_two_of_the_widest_blocks_a_step_writes_past_the_committed_length() -> (
    None
):
    chain, wide_tree = DraftShape.chain(3), DraftShape(8, 8, 64)
    assert (chain.window_len, wide_tree.window_len) == (4, 64)
    # without plain decoding no step leaves the draft behind: a chain's window is the widest
    assert draft_lag_width([chain]) == 1 and reserved_slots([chain]) == 8
    # plain steps leave their tokens in a lag of MAX_LAG, whose catch-up block reaches that
    # far past the committed length: wider than the chain's window, narrower than the tree's
    assert draft_lag_width([PLAIN, chain]) == MAX_LAG == 32
    assert reserved_slots([PLAIN, chain]) == 64
    assert reserved_slots([PLAIN, chain, wide_tree]) == 128


# shapes alike in one or two of their numbers, and not in the rest
_NUMBERS = [(0, 1, 1), (1, 1, 2), (2, 1, 3), (2, 2, 4), (2, 2, 5), (5, 4, 8), (5, 4, 16)]


@given(st.sampled_from(_NUMBERS), st.sampled_from(_NUMBERS))
def test_shapes_are_equal_and_hash_alike_by_their_three_numbers(
    first: tuple[int, int, int], second: tuple[int, int, int]
) -> None:
    a, b = DraftShape(*first), DraftShape(*second)
    assert (a == b) is (first == second)
    assert (a != b) is (first != second)
    assert (a < b) is (first < second)
    if first == second:
        assert hash(a) == hash(b)
        assert {a: 1}[b] == 1  # a table keyed by one shape finds it by an equal one
    assert a != first  # a shape is no tuple, though its numbers are
