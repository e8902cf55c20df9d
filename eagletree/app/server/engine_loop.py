"""The engine loop: one thread owns the engine; HTTP handlers talk to it through a queue.

Handlers call ``submit`` and ``abort`` from any thread: both only enqueue a command and return
at once (``submit`` a future of the request id, or of the ValueError that rejects it). The
loop thread drains the queue, steps the engine while it has work — so requests of every
client share its steps (continuous batching) — and hands each request's new tokens and text
to that request's sink, from the loop thread. Nothing else touches the engine.

Tensor-parallel, the loop runs on rank 0 and ``share`` hands each step's commands to the other
ranks before rank 0 applies them (``lockstep``); it is called at least every ``IDLE_WAIT_S``,
also without work, and with ``STOP`` last. Data-parallel, ``replica_loop.DataParallelLoop``
runs the same loop, placing each request on a replica and collecting the replicas' tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from eagletree.app.engine.loop import Engine
from eagletree.app.engine.streaming import OutputWatcher, StreamEvent
from eagletree.app.server.lockstep import STOP, AbortCommand, StepCommand, SubmitCommand
from eagletree.app.server.metrics import ServerMetrics
from eagletree.domain.sampling import SamplingParams

logger = logging.getLogger("eagletree.server")

Sink = Callable[[StreamEvent | BaseException], None]
Share = Callable[[list[StepCommand]], None]
IDLE_WAIT_S = 0.05


@dataclass(frozen=True, slots=True)
class QueuedSubmit:
    """A client's request, queued for the loop thread with where its output goes."""

    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink
    future: Future[int]


@dataclass(frozen=True, slots=True)
class QueuedAbort:
    """A client went away: abort its request (the id its submission's future gave)."""

    request_id: int


class EngineLoop:
    """Runs ``engine`` in a thread of its own; see the module docstring."""

    def __init__(
        self,
        engine: Engine,
        metrics: ServerMetrics | None = None,
        *,
        share: Share | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self._share = share
        self._on_failure = on_failure
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self._commands: queue.SimpleQueue[QueuedSubmit | QueuedAbort | None] = queue.SimpleQueue()
        self._watchers: dict[int, tuple[OutputWatcher, Sink]] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eagletree-engine", daemon=True)
        self.failure: BaseException | None = None
        self.metrics.update_memory(engine)

    # -- any thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort what is left, stop the thread and wait for it (at most ``timeout_s``)."""
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink) -> Future[int]:
        """Queue a request; the future holds its id, or the ValueError that rejected it."""
        future: Future[int] = Future()
        if not self.alive:
            future.set_exception(RuntimeError("the engine loop is not running"))
            return future
        self._commands.put(QueuedSubmit(prompt_ids, params, sink, future))
        return future

    def abort(self, request_id: int) -> None:
        """Abort a request (a client went away); its slots are freed at the next step."""
        self._commands.put(QueuedAbort(request_id))

    # -- the loop thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._run_round(self._drain(block=not self._has_work()))
            if self._share is not None:
                self._share([STOP])
            self.engine.close()
            self._publish()
        except BaseException as error:  # a bug: fail every open request instead of hanging it
            logger.exception("the engine loop stopped")
            self.failure = error
            for sink in self._open_sinks():
                sink(error)
            if self._on_failure is not None:
                self._on_failure(error)

    def _has_work(self) -> bool:
        return self.engine.has_work()

    def _run_round(self, commands: list[QueuedSubmit | QueuedAbort]) -> None:
        """Share the commands queued since the last round, apply them, step if there is work."""
        if self._share is not None:
            self._share([_wire(command) for command in commands])
        for command in commands:
            self._apply(command)
        if self.engine.has_work():
            self._step()

    def _open_sinks(self) -> list[Sink]:
        """The sinks of every unfinished request, forgotten (the loop failed)."""
        sinks = [sink for _, sink in self._watchers.values()]
        self._watchers.clear()
        return sinks

    def _drain(self, block: bool) -> list[QueuedSubmit | QueuedAbort]:
        """The commands queued now (waiting up to ``IDLE_WAIT_S`` for one if ``block``)."""
        commands: list[QueuedSubmit | QueuedAbort] = []
        try:
            command = self._commands.get(timeout=IDLE_WAIT_S) if block else None
            while True:
                if command is not None:  # None only wakes the loop (to stop)
                    commands.append(self._seeded(command))
                command = self._commands.get_nowait()
        except queue.Empty:
            return commands

    def _seeded(self, command: QueuedSubmit | QueuedAbort) -> QueuedSubmit | QueuedAbort:
        # an unseeded sampling request draws its seed from the process's entropy, which the
        # ranks do not share: rank 0 draws it and hands it to the others in the command
        if self._share is None or not isinstance(command, QueuedSubmit):
            return command
        params = command.params
        if params.greedy or params.seed is not None:
            return command
        seed = int.from_bytes(os.urandom(4), "little")
        return dataclasses.replace(command, params=dataclasses.replace(params, seed=seed))

    def _apply(self, command: QueuedSubmit | QueuedAbort) -> None:
        if isinstance(command, QueuedAbort):
            if self.engine.abort(command.request_id):
                with self.metrics.lock:
                    self.metrics.num_client_aborts += 1
            return
        try:
            request = self.engine.submit(command.prompt_ids, command.params)
        except ValueError as error:
            command.future.set_exception(error)
            return
        watcher = OutputWatcher(0, request, self.engine.tokenizer)
        self._watchers[request.request_id] = (watcher, command.sink)
        with self.metrics.lock:
            self.metrics.num_requests += 1
            self.metrics.num_prompt_tokens += len(command.prompt_ids)
        command.future.set_result(request.request_id)

    def _step(self) -> None:
        started = time.perf_counter()
        self.engine.step()
        deliveries: list[tuple[Sink, StreamEvent]] = []
        for request_id, (watcher, sink) in list(self._watchers.items()):
            event = watcher.poll()
            if event is None:
                continue
            if event.finished:
                event = StreamEvent(
                    event.index,
                    event.request_id,
                    event.token_ids,
                    event.text,
                    event.finish_reason,
                    self.engine.result_of(watcher.request),
                )
                del self._watchers[request_id]
            deliveries.append((sink, event))
        self._deliver(deliveries, time.perf_counter() - started)

    def _deliver(self, deliveries: list[tuple[Sink, StreamEvent]], step_s: float) -> None:
        """Record a step that took ``step_s`` and hand its events to their sinks."""
        for _, event in deliveries:
            if event.finished:
                self.metrics.record_finished(event)
        batch = sum(bool(event.token_ids) for _, event in deliveries)
        self.metrics.record_step(batch, step_s)
        self._publish()  # before the clients hear of the step, so /metrics is never behind them
        for sink, event in deliveries:
            sink(event)

    def _publish(self) -> None:
        self.metrics.update_memory(self.engine)


def _wire(command: QueuedSubmit | QueuedAbort) -> StepCommand:
    """What the other ranks need of a command: no sink, no future."""
    if isinstance(command, QueuedAbort):
        return AbortCommand(command.request_id)
    return SubmitCommand(command.prompt_ids, command.params)
