"""Acceptance report helpers: per-depth acceptance from the emitted histogram, looping tails."""

from __future__ import annotations

from eagletree.app.training.acceptance_row import TreeShape, is_looping, per_depth_acceptance
from eagletree.domain.acceptance_stats import AcceptanceStats


def test_per_depth_acceptance_is_conditional_on_reaching_the_depth() -> None:
    # emitted 1, 2, 2, 4 tokens: accepted 0, 1, 1, 3 drafts
    stats = AcceptanceStats.from_counts([1, 2, 2, 4])
    assert stats.mean_accept_length == 9 / 4
    # depth 1: 3 of 4 steps; depth 2: 1 of those 3; depth 3: 1 of 1; depth 4: none reached it
    assert per_depth_acceptance(stats, 4) == (3 / 4, 1 / 3, 1.0, 0.0)


def test_a_tail_that_repeats_with_a_short_period_loops() -> None:
    assert is_looping([9, 8] + [1, 2, 3] * 12)
    assert is_looping([5] * 30)
    assert not is_looping(list(range(60)))
    assert not is_looping([1, 2, 3] * 4)  # too short to tell
    assert not is_looping(list(range(30)) + [1, 2, 3] * 5)  # 15-token tail < min_tail 24


def test_shapes_name_chains_and_trees() -> None:
    assert TreeShape.chain(5) == TreeShape(5, 1, 6)
    assert TreeShape.chain(3).label == "chain S=3"
    assert TreeShape(3, 8, 16).label == "tree S=3 k=8 N=16"
