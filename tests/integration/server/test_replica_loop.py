"""The data-parallel server's loop in one process: rank 0's ``DataParallelLoop`` runs replica 0,
a thread runs replica 1 through ``follow_replica``, the broadcast and the report gather being
queues. Requests land on both replicas by load, each replica's tokens reach their sinks and
equal one engine's, an abort reaches the replica that runs the request, a refused prompt is
never placed, both replicas step together (the idle one too), and ``STOP`` ends the follower."""

from __future__ import annotations

import queue
import threading

import pytest

from eagletree import Engine
from eagletree.app.engine.streaming import StreamEvent
from eagletree.app.server.lockstep import STOP, PlacedSubmit, StepCommand
from eagletree.app.server.replica_loop import (
    DataParallelLoop,
    Replica,
    ReplicaReport,
    follow_replica,
)
from eagletree.domain.request import FinishReason
from eagletree.domain.sampling import SamplingParams

WAIT_S = 60.0
PROMPTS = ([1, 40, 41, 42], [7, 8], [3, 30, 31], [9, 90, 91, 92, 93])


class Events:
    """Every request's events, by the key its future gave; a semaphore per finished one."""

    def __init__(self) -> None:
        self.by_key: dict[int, list[StreamEvent]] = {}
        self.finished = threading.Semaphore(0)

    def sink(self, event: StreamEvent | BaseException) -> None:
        assert not isinstance(event, BaseException), event
        self.by_key.setdefault(event.request_id, []).append(event)
        if event.finished:
            self.finished.release()


def test_requests_spread_over_two_replicas_come_back_as_one_engines(
    engines: tuple[Engine, Engine], reference_engine: Engine
) -> None:
    leader, follower = engines
    to_follower: queue.SimpleQueue[list[StepCommand]] = queue.SimpleQueue()
    reports: queue.SimpleQueue[ReplicaReport] = queue.SimpleQueue()
    shared: list[list[StepCommand]] = []

    def share(commands: list[StepCommand]) -> None:
        shared.append(list(commands))
        to_follower.put(list(commands))

    def gather(report: ReplicaReport) -> list[ReplicaReport]:
        return [report, reports.get(timeout=WAIT_S)]

    def follower_gather(report: ReplicaReport) -> None:
        reports.put(report)

    replica_1 = Replica(follower, 1, watch=True)
    follower_thread = threading.Thread(
        target=follow_replica,
        args=(replica_1, lambda: to_follower.get(timeout=WAIT_S), follower_gather),
    )
    loop = DataParallelLoop(Replica(leader, 0, watch=True), 2, share=share, gather=gather)
    events = Events()
    follower_thread.start()
    loop.start()
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            loop.submit([10**6], SamplingParams(4), events.sink).result(WAIT_S)
        # the long one first: it holds replica 0, so the next ones go to replica 1 first
        aborted = loop.submit([5, 6, 7], SamplingParams(200), events.sink).result(WAIT_S)
        keys = [loop.submit(p, SamplingParams(10), events.sink).result(WAIT_S) for p in PROMPTS]
        sampled_params = SamplingParams(6, temperature=1.0)
        sampled = loop.submit(PROMPTS[0], sampled_params, events.sink).result(WAIT_S)
        loop.abort(aborted)
        for _ in range(len(PROMPTS) + 2):
            assert events.finished.acquire(timeout=WAIT_S)
    finally:
        loop.stop()
        follower_thread.join(WAIT_S)
    assert loop.failure is None
    assert not follower_thread.is_alive() and shared[-1] == [STOP]
    placed = [c for commands in shared for c in commands if isinstance(c, PlacedSubmit)]
    assert len(placed) == len(PROMPTS) + 2  # the refused prompt was never placed
    # an unseeded sampling request gets its seed on rank 0, before it is broadcast
    assert next(c for c in placed if c.key == sampled).params.seed is not None
    sampled_result = events.by_key[sampled][-1].result
    assert sampled_result is not None and 1 <= len(sampled_result.output_ids) <= 6
    replicas = {c.key: c.replica for c in placed}
    assert set(replicas.values()) == {0, 1}, replicas  # requests on both replicas
    counts = {replica: list(replicas.values()).count(replica) for replica in (0, 1)}
    assert loop.metrics.requests_by_replica == counts

    expected = reference_engine.generate(list(PROMPTS), max_new_tokens=10)
    for key, want in zip(keys, expected, strict=True):
        got = events.by_key[key]
        assert got[-1].result is not None and got[-1].result.output_ids == want.output_ids
        assert [t for event in got for t in event.token_ids] == want.output_ids  # streamed
        assert "".join(event.text for event in got) == want.text
    final = events.by_key[aborted][-1]
    assert final.finish_reason is FinishReason.ABORT  # it reached the replica that ran it
    assert final.result is not None and len(final.result.output_ids) < 200
    # one lockstep: both replicas ran every step, each finishing its own requests
    assert leader.stats.num_steps == follower.stats.num_steps
    for engine, replica in ((leader, 0), (follower, 1)):
        assert engine.stats.num_finished == counts[replica]
    # /metrics shows the group: both replicas' tokens and pools
    both = (leader, follower)
    assert loop.metrics.num_generated_tokens == sum(e.stats.num_generated_tokens for e in both)
    assert loop.metrics.kv_slots_total == sum(e.scheduler.allocator.size for e in both)
