"""What a worker is to the engine: one step over a schedule plan, and what that step produced."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, overload

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.domain.request import Request

# what a step's observer is called with: its decode requests and, per request, its row read
# back from the emitted count on: num_emitted, num_committed, then the step's observed columns
# (``StepOutput``)
StepObserver = Callable[[Sequence["Request"], Sequence[Sequence[int]]], None]


class ReadRows(Sequence[Sequence[int]]):
    """Each of ``rows`` through ``read``, applied only where indexed: an observer reads a few
    rows of a large batch (the shape policy 4 of 64), and cutting all of them cost the host
    5 µs a step at bs 64, where a small model's loop is host-bound."""

    def __init__(
        self, rows: Sequence[Sequence[int]], read: Callable[[Sequence[int]], Sequence[int]]
    ) -> None:
        self._rows, self._read = rows, read

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Sequence[int]: ...
    @overload
    def __getitem__(self, index: slice) -> list[Sequence[int]]: ...
    def __getitem__(self, index: int | slice) -> Sequence[int] | list[Sequence[int]]:
        if isinstance(index, slice):
            return [self._read(row) for row in self._rows[index]]
        return self._read(self._rows[index])


@dataclass(frozen=True, slots=True)
class StepOutput:
    """Per request of the step (row i = ``requests[i]``), as device tensors read back once.

    ``tokens`` (bs, max_emitted) int64: the tokens emitted by the step, the first
    ``num_emitted[i]`` of row i valid (1 without speculation; accept_length + 1 after a
    verify). ``num_committed`` (bs,) int64: tokens whose KV the step wrote (the whole fill on
    a prefill, 1 on a plain decode, accept_length + 1 after a verify).

    ``observed`` (bs, W) int64, with ``observer``: what the worker learns from the step beyond
    the counts (a speculative worker: each accepted tree path's ranks and offers), read back
    with the tokens; ``observer(decode requests, their host rows)`` gets each decode row from
    its emitted count on (``StepObserver``); prefill rows are not handed over.
    """

    requests: list[Request]  # the plan's prefill requests first, then its decode requests
    tokens: torch.Tensor
    num_emitted: torch.Tensor
    num_committed: torch.Tensor
    num_forwards: int  # model forwards the step ran (target and draft)
    num_prefill: int  # rows [0, num_prefill) were prefills
    speculative: bool = False  # decode rows were verify steps: their emitted counts are recorded
    observed: torch.Tensor | None = None
    observer: StepObserver | None = None


def joined_phases(
    outputs: Sequence[StepOutput], num_prefill: int, *, speculative: bool
) -> StepOutput:
    """One ``StepOutput`` of a step's phases — its prefill's, then its decode's — rows in that
    order: the tokens padded to the widest phase's, the decode rows' ``observed`` columns kept
    (the prefill rows observe nothing: zeros) with their ``observer``."""
    if len(outputs) == 1:  # one phase: its tensors as they are (no joining kernels)
        only = outputs[0]
        if only.num_prefill == num_prefill and only.speculative == speculative:
            return only
        return replace(only, num_prefill=num_prefill, speculative=speculative)
    prefill, decode = outputs
    width = max(part.tokens.shape[1] for part in outputs)
    tokens = [
        F.pad(part.tokens, (0, width - part.tokens.shape[1]))
        if part.tokens.shape[1] < width
        else part.tokens
        for part in outputs
    ]
    observed = decode.observed
    if observed is not None:
        observed = torch.cat(
            [observed.new_zeros(len(prefill.requests), observed.shape[1]), observed]
        )
    return StepOutput(
        requests=[*prefill.requests, *decode.requests],
        tokens=torch.cat(tokens),
        num_emitted=torch.cat([part.num_emitted for part in outputs]),
        num_committed=torch.cat([part.num_committed for part in outputs]),
        num_forwards=sum(part.num_forwards for part in outputs),
        num_prefill=num_prefill,
        speculative=speculative,
        observed=observed,
        observer=decode.observer,
    )


class Worker(Protocol):
    """Runs one step's device work over a plan from ``Scheduler.schedule``.

    ``reserve_per_step``: slots the scheduler keeps backed past each running request's committed
    length before every step (1 without speculation, 2 when it may run ahead; ``2·max(S·k, N)``
    for a v2 tree worker).
    ``grow_ahead``: slots past that the scheduler may back at once when a window grows, so that
    windows grow one step in several (``Scheduler``); 0 for a worker that gives its windows'
    tails back every step (v1), which would grow them again every step.
    The plan's ``retracted`` and ``released`` requests no longer own rows: a worker drops any
    device state it keeps for them. ``step`` must not synchronise with the host.

    ``can_run_ahead(decode)``: whether a decode step over ``decode`` may be launched while the
    previous step is still in flight, i.e. from the device's own committed lengths, the host's
    being only lower bounds (``SchedulePlan.exact_lengths`` False). Workers that keep host
    books per step (v1; the plain worker without ``run_ahead``, whose pending tokens come from
    the host) say False and the engine runs them synchronously.

    ``capture_graphs(progress)``: capture the CUDA graphs of the worker's decode steps (one
    per batch-size bucket it was built with; none without) before the engine runs, reporting
    progress lines through ``progress`` (default: a logger); returns the seconds it took.
    ``calibrate(progress)``: after that, measure what the worker's per-step choices need (an
    adaptive worker's step costs); nothing for a worker that chooses nothing.
    ``untimed_steps()``: a context whose steps teach those choices nothing of what a step
    costs (steps slowed by a profiler); the first step after it is not timed either.
    """

    @property
    def reserve_per_step(self) -> int: ...

    @property
    def grow_ahead(self) -> int: ...

    def can_run_ahead(self, decode: Sequence[Request]) -> bool: ...

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float: ...

    def calibrate(self, progress: Callable[[str], None] | None = None) -> None: ...

    def untimed_steps(self) -> AbstractContextManager[None]: ...

    def step(self, plan: SchedulePlan) -> StepOutput: ...
