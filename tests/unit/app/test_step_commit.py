"""A read step's hand-off to its worker's observer: each decode row's counts and observed
columns, cut only where read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from eagletree.app.engine.commit import commit_step
from eagletree.app.engine.reports import EngineStats
from eagletree.app.engine.transfers import StepReadback
from eagletree.app.engine.worker import StepOutput
from eagletree.domain.request import FinishReason, Request
from eagletree.domain.sampling import SamplingParams


def _step(observed: torch.Tensor | None) -> tuple[StepOutput, list[tuple[Sequence[int], ...]]]:
    params = SamplingParams(max_new_tokens=8, temperature=0.0, seed=0)
    requests = [Request(i, [1, 2, 3], params, 64) for i in range(3)]  # one prefill, two decode
    for request in requests:  # finished while the step ran: it still tells what was accepted
        request.finish_reason = FinishReason.ABORT
    seen: list[tuple[Sequence[int], ...]] = []

    def observer(decode: Sequence[Request], rows: Sequence[Sequence[int]]) -> None:
        assert [r.request_id for r in decode] == [1, 2]
        assert len(rows) == len(decode)
        seen.append((*(rows[i] for i in range(len(rows))), *rows[::-1]))

    output = StepOutput(
        requests=requests,
        tokens=torch.tensor([[7, 0], [8, 9], [10, 0]]),
        num_emitted=torch.tensor([1, 2, 1]),
        num_committed=torch.tensor([3, 2, 1]),
        num_forwards=2,
        num_prefill=1,
        speculative=True,
        observed=observed,
        observer=observer,
    )
    return output, seen


def test_the_observer_reads_each_decode_rows_counts_and_observed_columns() -> None:
    observed = torch.tensor([[0, 0, 0, 0], [0, -1, 2, 0], [1, 0, 3, 1]])  # (bs, 2 S), S = 2
    output, seen = _step(observed)
    commit_step(StepReadback().start(output), set(), lambda: 0.0, EngineStats())
    (rows,) = seen
    # by index, then as a slice (reversed): the decode rows' columns after their tokens
    first, second = [2, 2, 0, -1, 2, 0], [1, 1, 1, 0, 3, 1]
    assert rows == (first, second, second, first)


def test_a_step_without_observed_columns_hands_over_the_counts() -> None:
    output, seen = _step(None)
    got: list[list[Sequence[int]]] = []
    output = replace(output, observer=lambda decode, rows: got.append(list(rows)))
    commit_step(StepReadback().start(output), set(), lambda: 0.0, EngineStats())
    assert got == [[[2, 2], [1, 1]]] and not seen
