"""The acceptance table's pure parts: its shape grid, best-tree picks, rows and goals."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.real_pair.goals import GOAL_SHAPES, Goal, acceptance_goals, goal_shapes_first
from benchmarks.real_pair.table import (
    HeadTable,
    best_tree_per_budget,
    best_tree_per_depth,
    shape_grid,
)
from eagletree.app.training.acceptance_row import AcceptanceRow, TreeShape, match_rate, merged
from eagletree.domain.acceptance_stats import AcceptanceStats


def row(shape: TreeShape, accept: float) -> AcceptanceRow:
    return AcceptanceRow(shape, accept, (), 1, True, 0.0, 0.0)


@given(
    depths=st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True),
    budgets=st.lists(st.integers(2, 80), min_size=1, max_size=4, unique=True),
    topks=st.lists(st.integers(1, 10), min_size=1, max_size=3, unique=True),
)
def test_the_grid_is_chains_then_every_tree_that_fits(
    depths: list[int], budgets: list[int], topks: list[int]
) -> None:
    grid = shape_grid(depths, budgets, topks)
    assert grid[: len(depths)] == [TreeShape.chain(d) for d in depths]
    trees = grid[len(depths) :]
    expected = {
        (d, k, n)
        for n in budgets
        for d in depths
        for k in topks
        if k > 1 and n <= 1 + k + (d - 1) * k * k
    }
    assert {tuple(t) for t in trees} == expected and len(trees) == len(expected)
    order = [(topks.index(t.topk), budgets.index(t.num_draft_tokens)) for t in trees]
    # by width, then budget: a time budget cuts second widths before any budget goes unmeasured
    assert order == sorted(order)


def test_best_trees_are_picked_per_budget_and_per_depth_within_the_budget_cap() -> None:
    rows = [
        row(TreeShape.chain(5), 9.0),  # chains are never the best tree
        row(TreeShape(5, 4, 8), 3.0),
        row(TreeShape(5, 8, 8), 3.5),
        row(TreeShape(7, 4, 8), 3.2),
        row(TreeShape(5, 4, 64), 5.0),  # over the depth pick's cap of 32
        row(TreeShape(5, 4, 16), 4.0),
    ]
    per_budget = best_tree_per_budget(rows)
    assert list(per_budget) == [8, 16, 64]
    assert per_budget[8].shape == TreeShape(5, 8, 8)
    per_depth = best_tree_per_depth(rows)
    assert per_depth[5].shape == TreeShape(5, 4, 16) and per_depth[7].shape == TreeShape(7, 4, 8)


def test_a_row_separates_looping_continuations_and_scores_the_match() -> None:
    loop = [7, 8] * 20  # repeats with period 2
    text = list(range(40))
    stats = [AcceptanceStats.from_counts([4, 4]), AcceptanceStats.from_counts([1, 2, 3])]
    r = AcceptanceRow.of(
        TreeShape.chain(3),
        stats,
        [loop, text],
        matches_plain=False,
        seconds=0.0,
        reference=[loop, [*range(20), 99, *range(21, 40)]],
    )
    assert r.looping_share == 0.5
    assert r.mean_accept_length == 14 / 5 and r.non_looping_accept_length == 2.0
    assert r.num_verify_steps == 5
    assert r.match_rate == (1.0 + 20 / 40) / 2
    assert merged(stats).histogram == (0, 1, 1, 1, 2)


def test_match_rate_counts_up_to_the_first_difference() -> None:
    assert match_rate([[1, 2, 3, 4]], [[1, 2, 9, 4]]) == 0.5
    assert match_rate([[1, 2]], [[1, 2, 3, 4]]) == 0.5  # a shorter output stops matching
    assert match_rate([[5]], [[]]) == 1.0


def test_goals_compare_measured_figures_and_say_when_one_is_missing() -> None:
    assert Goal("g", 3.0, 2.0, 1.5).met is True
    assert Goal("g", 2.9, 2.0, 1.5).met is False
    assert (
        Goal("g", None, 2.0, 1.5).met is None and "not measured" in Goal("g", None, 2.0, 1.5).line()
    )
    table = HeadTable("eagle", greedy=[row(TreeShape(6, 8, 32), 3.0)])  # no chain measured
    goals = {g.name: g for g in acceptance_goals({"eagle": table}, {}, {})}
    assert goals["eagle: tree S6 k8 N32 vs chain S6"].met is None
    assert goals["eagle: teacher-forced top-1 agreement at its lowest unrolled step"].met is None
    table.greedy += [row(TreeShape.chain(6), 2.4), row(TreeShape.chain(7), 2.5)]
    simulated = {"eagle": [row(TreeShape.chain(7), 2.6)]}
    trained = {"eagle": {"agreement_by_step": [0.8, 0.74, 0.9]}}
    goals = {g.name: g for g in acceptance_goals({"eagle": table}, simulated, trained)}
    assert goals["eagle: tree S6 k8 N32 vs chain S6"].met is True
    assert goals["eagle: engine chain S7 vs the same head's chain S7 simulated offline"].met
    # the lowest step decides: 0.74 < 0.75
    agreement = goals["eagle: teacher-forced top-1 agreement at its lowest unrolled step"]
    assert agreement.met is False
    assert agreement.line().endswith(": 0.74 (goal ≥ 0.75) — MISSED")  # a bar, not a ratio
    heads = {"eagle": table, "eagle3": HeadTable("eagle3", greedy=[row(TreeShape.chain(7), 2.7)])}
    goals = {g.name: g for g in acceptance_goals(heads, {}, {})}
    assert goals["EAGLE-3 vs EAGLE-1: chain S7"].met is True  # 2.7 ≥ 1.05 × 2.5
    assert goals["EAGLE-3 vs EAGLE-1: chain S5"].met is None


def test_the_goals_shapes_are_measured_first_and_the_rest_keep_their_order() -> None:
    grid = shape_grid([3, 5, 6, 7], [8, 32], [8])
    ordered = goal_shapes_first(grid)
    assert sorted(ordered, key=repr) == sorted(grid, key=repr)  # the same shapes
    assert ordered[: len(GOAL_SHAPES)] == list(GOAL_SHAPES)
    rest = [shape for shape in grid if shape not in GOAL_SHAPES]
    assert ordered[len(GOAL_SHAPES) :] == rest
    # a grid without some goal shape keeps the ones it has, in the goals' order
    assert goal_shapes_first([TreeShape.chain(3), TreeShape.chain(7)])[0] == TreeShape.chain(7)
