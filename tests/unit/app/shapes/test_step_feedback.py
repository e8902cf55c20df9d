"""What a shape policy is handed when a decode step is read back: the step's time, and each
request's accepted path (ranks then offers) — a chain's from its emitted count, a tree's from
its observed columns — as the engine's commit hands the rows over."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import pytest

from eagletree.app.engine.worker import ReadRows
from eagletree.app.workers.shapes.step_costs import ReadBackClock
from eagletree.app.workers.shapes.step_feedback import StepFeedback
from eagletree.domain.accepted_path import chain_path_ranks
from eagletree.domain.draft_shape import PLAIN, DraftShape
from eagletree.domain.request import Request
from tests.integration.spec.harness import RecordingPolicy

from .policy_fixtures import requests_at


class _Recording(RecordingPolicy):
    """Keeps what it is handed (the harness's recording policy; it never drafts itself)."""

    def pick(self, decode: Sequence[Request]) -> DraftShape:
        return PLAIN


def _read_back(
    feedback: StepFeedback, shape: DraftShape, rows: list[list[int]], width: int
) -> None:
    """Launch one step of ``shape`` and read it back with the engine's rows (``width`` token
    columns, then num_emitted, num_committed and any observed columns)."""
    feedback.launched()
    observer = feedback.observer(shape, timed=True, paths=True, catch_up=False, sampled=False)
    assert observer is not None
    requests = requests_at([0.0] * len(rows))
    observer(requests, ReadRows(rows, itemgetter(slice(width, None))))


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_a_chains_path_follows_from_its_emitted_count_at_every_length(depth: int) -> None:
    policy = _Recording([PLAIN])
    feedback = StepFeedback(policy)
    # one row per accepted length 0..depth: emitted = accepted + 1; tokens before the counts
    rows = [[7] * (depth + 1) + [accepted + 1, accepted + 1] for accepted in range(depth + 1)]
    for _ in range(2):  # the second read goes through the paths made for the first
        _read_back(feedback, DraftShape.chain(depth), rows, depth + 1)
    expected = [chain_path_ranks(accepted, depth) for accepted in range(depth + 1)]
    assert [path for _, _, path in policy.observed] == expected + expected


def test_a_trees_path_is_its_observed_columns() -> None:
    policy = _Recording([PLAIN])
    feedback = StepFeedback(policy)
    tree = DraftShape(2, 2, 4)
    observed = [[0, -1, 2, 0], [1, 0, 2, 2]]  # ranks then offers, S = 2 each
    rows = [[5, 6, 0] + [2, 2] + observed[0], [5, 6, 9] + [3, 3] + observed[1]]
    _read_back(feedback, tree, rows, 3)
    assert [path for _, _, path in policy.observed] == observed


def test_a_step_is_timed_from_the_read_back_of_the_one_before() -> None:
    policy = _Recording([PLAIN])
    now = iter([1.0, 1.5, 3.0])
    feedback = StepFeedback(policy, ReadBackClock(lambda: next(now)))
    chain = DraftShape.chain(1)
    rows = [[7, 7, 1, 1]]
    for _ in range(3):
        _read_back(feedback, chain, rows, 2)
    # the first has no read-back before it; the next two took 0.5 and 1.5 s
    assert policy.timed == [(chain, 1, False, 0.5, False), (chain, 1, False, 1.5, False)]
