"""Application: the first request of a freshly built engine (cold: what the engine compiles,
captures or allocates on first use lands in it) against the same request again (warm).

A request is ``generate`` of one prompt, greedy, end to end: prefill, every decode step, the
tokens read back. In a data-parallel group replica 0 runs it while the others step idle, as
the windows do, and the time is the slowest replica's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from eagletree.app.bench.lockstep import ALONE, Lockstep
from eagletree.app.bench.measure import step_until
from eagletree.app.bench.profiling import synchronize
from eagletree.domain.request import RequestStatus
from eagletree.domain.sampling import SamplingParams

if TYPE_CHECKING:
    from eagletree.app.engine.loop import Engine


def first_request_seconds(
    engine: Engine,
    prompt: Sequence[int],
    new_tokens: int,
    cuda: bool,
    lockstep: Lockstep = ALONE,
) -> tuple[float, float]:
    """(cold, warm) seconds of one request of ``prompt`` for ``new_tokens`` tokens: the
    engine's first request, then the same again. Call it before anything else runs on the
    engine."""
    cold = _request_seconds(engine, prompt, new_tokens, cuda, lockstep)
    warm = _request_seconds(engine, prompt, new_tokens, cuda, lockstep)
    return cold, warm


def _request_seconds(
    engine: Engine, prompt: Sequence[int], new_tokens: int, cuda: bool, lockstep: Lockstep
) -> float:
    synchronize(cuda)
    started = time.perf_counter()
    if not lockstep.grouped:
        engine.generate([prompt], new_tokens)  # what a user calls
    else:  # generate would step this replica alone: the group steps together instead
        params = SamplingParams(max_new_tokens=new_tokens)
        requests = [engine.submit(prompt, params)] if lockstep.replica == 0 else []
        done = lambda: all(r.status is RequestStatus.FINISHED for r in requests)  # noqa: E731
        step_until(engine, lockstep, done, "the first request")
    synchronize(cuda)
    seconds = time.perf_counter() - started
    return -lockstep.minimum([-seconds])[0]  # the slowest replica's
