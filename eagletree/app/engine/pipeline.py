"""App: the engine's steps from launch to commit, at most one of them in flight between calls.

``Engine.step`` schedules a plan and hands it here: the worker's step is launched, its outputs
start on their way to the host (app/engine/transfers.py), and the step launched before it is read —
its tokens committed (app/engine/commit.py), the requests it finished released. Without overlap
the step just launched is read in the same call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from eagletree.app.engine.commit import commit_step
from eagletree.app.engine.transfers import PendingStep, StepReadback

if TYPE_CHECKING:
    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.app.engine.reports import EngineStats
    from eagletree.app.engine.scheduler import Scheduler
    from eagletree.app.engine.worker import Worker
    from eagletree.domain.request import Request


class StepPipeline:
    """Launches the worker's steps and reads them back, one step behind with ``overlap``.

    With ``overlap`` the step launched by one ``advance`` is read by the next, after that one
    launched its own (from the lower bounds the host has of the running requests' lengths, the
    worker taking the exact ones from the device), so the host's work of step i — stops,
    finishing, releasing — runs while the device computes step i + 1 (docs/speculative.md).
    Outputs are those of the synchronous loop. Where the worker cannot run ahead
    (``Worker.can_run_ahead``) or the next schedule would retract, ``read_first`` reads the step
    in flight before the engine schedules.
    """

    def __init__(
        self, worker: Worker, scheduler: Scheduler, clock: Callable[[], float], *, overlap: bool
    ) -> None:
        self.overlap = overlap
        self._worker = worker
        self._scheduler = scheduler
        self._clock = clock
        self._readback = StepReadback()
        self._in_flight: PendingStep | None = None

    @property
    def has_step_in_flight(self) -> bool:
        return self._in_flight is not None

    def read_first(self, eos_token_ids: Collection[int], stats: EngineStats) -> list[Request]:
        """Read the step in flight now if the next step may not launch before it is read;
        returns the requests released."""
        if self._in_flight is None or self._can_run_ahead():
            return []
        return self.read(eos_token_ids, stats)

    def advance(
        self, plan: SchedulePlan | None, eos_token_ids: Collection[int], stats: EngineStats
    ) -> list[Request]:
        """Launch ``plan``'s step (None: none this call), then read the step in flight before
        it — and, without overlap, this one; returns the requests released."""
        launched = None
        if plan is not None:
            if self._in_flight is not None:
                plan = dataclasses.replace(plan, exact_lengths=False)
                stats.num_steps_ahead += 1
            output = self._worker.step(plan)
            for request in plan.prefill:  # a prefill's KV count is known before it runs
                request.commit(request.num_tokens - request.committed_len)
            launched = self._readback.start(output)
        finished = [] if self._in_flight is None else self.read(eos_token_ids, stats)
        self._in_flight = launched
        if not self.overlap:
            finished += self.read(eos_token_ids, stats)
        return finished

    def read(self, eos_token_ids: Collection[int], stats: EngineStats) -> list[Request]:
        """Read the step in flight (if any), commit its tokens, release what finished."""
        pending, self._in_flight = self._in_flight, None
        if pending is not None:
            commit_step(pending, eos_token_ids, self._clock, stats)
        return self._scheduler.release_finished()

    def _can_run_ahead(self) -> bool:
        """Whether the next step may launch before the one in flight is read."""
        running = self._scheduler.running
        return self._worker.can_run_ahead(running) and not self._scheduler.must_retract()
