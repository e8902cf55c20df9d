"""A spawned group never hangs: a rank that raises ends the others and the error names it; a
rank still running at the deadline is killed and named."""

from __future__ import annotations

import time

import pytest

from eagletree.app.parallel.spawned_group import RankFailed, spawn_ranks
from tests.integration.parallel.tp_rank import fail_on_rank_one, hang_on_rank_one


def test_a_rank_that_raises_ends_the_group_with_its_rank_and_error() -> None:
    started = time.monotonic()
    with pytest.raises(RankFailed, match=r"(?s)rank 1 of 2 failed first.*broke on purpose"):
        spawn_ranks(fail_on_rank_one, 2, timeout_s=60)
    assert time.monotonic() - started < 60


def test_a_rank_running_past_the_deadline_is_killed_and_named() -> None:
    # a deadline rank 0 (which returns at once) meets even on a loaded 2-core machine, where
    # starting a spawned interpreter and importing torch took more than 8 s
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] of 2 still running after 20 s"):
        spawn_ranks(hang_on_rank_one, 2, timeout_s=20)
