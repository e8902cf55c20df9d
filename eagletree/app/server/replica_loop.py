"""App: the data-parallel server — rank 0 places each request on a replica, the replicas step
in lockstep and report their requests' tokens back to rank 0.

Global rank 0 (replica 0's tensor-parallel rank 0) alone has HTTP clients. Its loop
(``DataParallelLoop``) checks each new request against its own engine (every replica is built
from the same settings, so a replica refuses exactly what rank 0 refuses), places it on the
replica with the least load (``route_by_load``, the loads the replicas reported after the last
step) under a key of its own, and broadcasts the round's placed submissions and aborts to every
rank (``lockstep.CommandBroadcast``), with ``STEP`` while any replica has work. Every rank of a
replica applies what was placed on its replica (``Replica``); on ``STEP`` every rank steps, a
replica without requests running its idle step, so every replica's collectives stay matched
and the group ends together. After the step each replica's tensor-parallel rank 0 sends its
report — its requests' new tokens and text, finished results, load and gauges — to rank 0 in
one gather of picklable objects over the data-parallel gloo group (host values only; the step
has already read its tokens back). Rank 0 hands the events to the requests' sinks as the
single-process loop does. While no replica has work rank 0 broadcasts an empty list every
``IDLE_WAIT_S`` (the heartbeat) and nobody steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from eagletree.app.engine.loop import Engine
from eagletree.app.engine.streaming import OutputWatcher, StreamEvent
from eagletree.app.parallel.router import load_of, route_by_load
from eagletree.app.server.engine_loop import EngineLoop, QueuedAbort, QueuedSubmit, Share, Sink
from eagletree.app.server.lockstep import (
    STEP,
    STOP,
    PlacedAbort,
    PlacedSubmit,
    StepCommand,
)
from eagletree.app.server.metrics import EngineGauges, ServerMetrics
from eagletree.domain.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """What one replica tells rank 0 after a step. ``events``: its requests' output since the
    last report, ``request_id`` being rank 0's key (a finished one's ``result`` carries the
    replica engine's own id)."""

    events: list[StreamEvent]
    load: int  # the router's measure: tokens of its running and waiting requests
    has_work: bool
    gauges: EngineGauges


Gather = Callable[[ReplicaReport], list[ReplicaReport] | None]


class Replica:
    """One rank's view of its data-parallel replica ``index``: applies what rank 0 placed on
    it and steps. With ``watch`` (the replica's tensor-parallel rank 0, which reports) it
    follows its requests' output; its other ranks only keep the requests, for aborts."""

    def __init__(self, engine: Engine, index: int, *, watch: bool) -> None:
        self.engine = engine
        self.index = index
        self._watch = watch
        self._requests: dict[int, Request] = {}  # by key, unfinished
        self._watchers: dict[int, OutputWatcher] = {}

    def apply(self, commands: list[StepCommand]) -> None:
        """Submit and abort what was placed on this replica (the rest is another's)."""
        for command in commands:
            if isinstance(command, PlacedSubmit) and command.replica == self.index:
                # rank 0 ran the same checks on the same settings: a refusal here is a bug
                request = self.engine.submit(command.prompt_ids, command.params)
                self._requests[command.key] = request
                if self._watch:
                    self._watchers[command.key] = OutputWatcher(0, request, self.engine.tokenizer)
            elif isinstance(command, PlacedAbort) and command.replica == self.index:
                placed = self._requests.get(command.key)
                if placed is not None:  # else it finished before the abort came
                    self.engine.abort(placed.request_id)

    def step(self) -> ReplicaReport:
        """One lockstep step (idle without requests); the report of what it produced."""
        self.engine.step(run_idle=True)
        events: list[StreamEvent] = []
        for key, watcher in list(self._watchers.items()):
            event = watcher.poll()
            if event is None:
                continue
            if event.finished:
                del self._watchers[key]
                event = dataclasses.replace(event, result=self.engine.result_of(watcher.request))
            events.append(dataclasses.replace(event, request_id=key))
        for key in [k for k, r in self._requests.items() if r.status is RequestStatus.FINISHED]:
            del self._requests[key]
        engine = self.engine
        return ReplicaReport(
            events, load_of(engine.scheduler), engine.has_work(), EngineGauges.of(engine)
        )


def report_gather(group: dist.ProcessGroup | None, num_replicas: int) -> Gather:
    """Gather every replica's report on global rank 0 over ``group`` (the tensor-parallel
    rank 0s of the replicas: a gloo group); None on the other ranks."""

    def gather(report: ReplicaReport) -> list[ReplicaReport] | None:
        if group is None:
            return [report]
        leader = dist.get_rank() == 0
        gathered: list[object] | None = [None] * num_replicas if leader else None
        # SYNC: a host exchange once a step, after the step read its tokens back
        dist.gather_object(report, gathered, dst=0, group=group)
        if gathered is None:
            return None
        return [report for report in gathered if isinstance(report, ReplicaReport)]

    return gather


def follow_replica(
    replica: Replica,
    receive: Callable[[], list[StepCommand]],
    gather: Gather | None,
) -> None:
    """A rank other than global rank 0: apply rank 0's rounds to ``replica``, step on ``STEP``
    and (its tensor-parallel rank 0) report, until ``STOP``; then close the engine."""
    with replica.engine:
        while True:
            commands = receive()
            if STOP in commands:
                return
            replica.apply(commands)
            if STEP in commands:
                report = replica.step()
                if gather is not None:
                    gather(report)


class DataParallelLoop(EngineLoop):
    """Global rank 0's engine loop over ``num_replicas`` replicas, itself running replica 0
    (``replica``); see the module docstring. Request ids it hands out are its keys."""

    def __init__(
        self,
        replica: Replica,
        num_replicas: int,
        *,
        share: Share,
        gather: Gather,
        metrics: ServerMetrics | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__(replica.engine, metrics, share=share, on_failure=on_failure)
        self._replica = replica
        self._gather = gather
        self._loads = [0] * num_replicas
        self._busy = [False] * num_replicas
        self._owners: dict[int, tuple[int, Sink]] = {}  # key -> (replica, sink), unfinished
        self._next_key = 0
        self._gauges = EngineGauges.of(replica.engine)

    def _has_work(self) -> bool:
        return any(self._busy)

    def _run_round(self, commands: list[QueuedSubmit | QueuedAbort]) -> None:
        placed = self._place(commands)
        step = self._has_work() or any(isinstance(c, PlacedSubmit) for c in placed)
        assert self._share is not None
        self._share([*placed, STEP] if step else placed)
        self._replica.apply(placed)
        if step:
            self._step()

    def _place(self, commands: list[QueuedSubmit | QueuedAbort]) -> list[StepCommand]:
        """The round's aborts, sent to the replicas that own them, then its accepted
        submissions, each placed on the least loaded replica (its future gets the key)."""
        placed: list[StepCommand] = []
        accepted: list[QueuedSubmit] = []
        for command in commands:
            if isinstance(command, QueuedAbort):
                owner = self._owners.get(command.request_id)
                if owner is not None:
                    placed.append(PlacedAbort(command.request_id, owner[0]))
                    with self.metrics.lock:
                        self.metrics.num_client_aborts += 1
                continue
            try:
                key = self._next_key + len(accepted)
                self.engine.check_prompt(key, command.prompt_ids, command.params.max_new_tokens)
            except ValueError as error:
                command.future.set_exception(error)
                continue
            accepted.append(command)
        lengths = [len(command.prompt_ids) for command in accepted]
        for command, replica in zip(accepted, route_by_load(lengths, self._loads), strict=True):
            key, self._next_key = self._next_key, self._next_key + 1
            self._owners[key] = (replica, command.sink)
            self._loads[replica] += len(command.prompt_ids)
            placed.append(PlacedSubmit(key, replica, command.prompt_ids, command.params))
            with self.metrics.lock:
                self.metrics.num_requests += 1
                self.metrics.requests_by_replica[replica] += 1
                self.metrics.num_prompt_tokens += len(command.prompt_ids)
            command.future.set_result(key)
        return placed

    def _step(self) -> None:
        started = time.perf_counter()
        reports = self._gather(self._replica.step())
        assert reports is not None and len(reports) == len(self._loads)  # rank 0 gathers all
        deliveries: list[tuple[Sink, StreamEvent]] = []
        for index, report in enumerate(reports):
            self._loads[index] = report.load
            self._busy[index] = report.has_work
            for event in report.events:
                _, sink = self._owners[event.request_id]
                if event.finished:
                    del self._owners[event.request_id]
                deliveries.append((sink, event))
        self._gauges = EngineGauges.summed([report.gauges for report in reports])
        self._deliver(deliveries, time.perf_counter() - started)

    def _open_sinks(self) -> list[Sink]:
        sinks = [sink for _, sink in self._owners.values()]
        self._owners.clear()
        return sinks

    def _publish(self) -> None:
        self.metrics.update_gauges(self._gauges)
