"""The tensor-parallel server's lockstep in one process: a follower that replays what rank 0's
engine loop broadcast runs the same steps to the same tokens, unseeded sampling and client
aborts included, and the loop broadcasts while idle and ``STOP`` last."""

from __future__ import annotations

import threading

from eagletree import Engine
from eagletree.app.engine.streaming import StreamEvent
from eagletree.app.server.engine_loop import EngineLoop
from eagletree.app.server.lockstep import STOP, StepCommand, SubmitCommand, follow
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams

WAIT_S = 60.0


def test_a_follower_replaying_the_broadcasts_runs_rank_0s_steps(
    engines: tuple[Engine, Engine],
) -> None:
    leader, follower = engines
    shared: list[list[StepCommand]] = []
    loop = EngineLoop(leader, share=lambda commands: shared.append(list(commands)))
    outputs: dict[int, list[int]] = {}
    finished = threading.Semaphore(0)

    def sink(event: StreamEvent | BaseException) -> None:
        assert not isinstance(event, BaseException), event
        if event.result is not None:
            outputs[event.request_id] = event.result.output_ids
            finished.release()

    loop.start()
    try:
        prompt = [1, 40, 41, 42]
        sampled = loop.submit(prompt, SamplingParams(12, temperature=1.0), sink).result(WAIT_S)
        greedy = loop.submit(prompt[:2], SamplingParams(10), sink).result(WAIT_S)
        aborted = loop.submit(prompt, SamplingParams(200), sink).result(WAIT_S)
        loop.abort(aborted)
        for _ in range(3):
            assert finished.acquire(timeout=WAIT_S)
    finally:
        loop.stop()
    assert loop.failure is None
    assert shared[-1] == [STOP]
    assert [] in shared  # the idle loop still broadcasts: the followers' wait stays short
    submits = [c for commands in shared for c in commands if isinstance(c, SubmitCommand)]
    assert len(submits) == 3 and submits[0].params.seed is not None  # rank 0 drew it

    replayed: dict[int, Request] = {}
    lists = iter(shared)

    def keep(request: Request) -> None:
        replayed[request.request_id] = request

    follow(follower, lambda: next(lists), keep)
    assert sorted(replayed) == [sampled, greedy, aborted]
    for request_id in (sampled, greedy):
        assert replayed[request_id].output_ids == outputs[request_id]
    assert len(outputs[sampled]) >= 1 and len(outputs[greedy]) == 10
    assert replayed[aborted].output_ids == outputs[aborted]  # cut at the same step
    assert follower.stats.num_steps == leader.stats.num_steps
