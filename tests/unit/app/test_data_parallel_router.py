"""The data-parallel router: each new request to the least loaded rank, ties to the lowest
rank, a placed request's prompt counted in its rank's load for the next one."""

from __future__ import annotations

import pytest

from eagletree.app.parallel.router import route_by_load


def test_each_request_goes_to_the_least_loaded_rank_counting_the_ones_placed_before() -> None:
    # loads 10 0 4 → 5 to rank 1: 10 5 4 → 3 to rank 2: 10 5 7 → 2 to rank 1: 10 7 7 → 20 to
    # rank 1 (tied with rank 2)
    assert route_by_load([5, 3, 2, 20], [10, 0, 4]) == [1, 2, 1, 1]


def test_ties_go_to_the_lowest_rank() -> None:
    assert route_by_load([1, 1, 1, 1], [0, 0]) == [0, 1, 0, 1]
    assert route_by_load([2], [3, 3, 3]) == [0]


def test_no_requests_no_placement_and_no_ranks_is_an_error() -> None:
    assert route_by_load([], [1, 2]) == []
    with pytest.raises(ValueError, match="at least one rank"):
        route_by_load([1], [])
