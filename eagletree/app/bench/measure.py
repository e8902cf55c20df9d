"""Application: time steady decode steps of an engine, prefill excluded, and profile a few more.

One measurement submits a batch of prompts, steps until every request is prefilled, runs a few
warm-up steps (kernels compile, the allocator settles), times the decode steps that generate
``new_tokens`` tokens per request, then runs ``profile_steps`` more under ``torch.profiler``
(``profiling``). The requests get a token budget that no request can spend inside the measured
window however unevenly they advance; what is left is aborted afterwards, so that the engine
can measure the next batch. A request that ends anyway (an EOS or stop token, the context
limit) is accounted for: its tokens count, the window no longer waits for it, and the
measurement says how many ended early. A retracted request is an error (the pool is too small).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from eagletree.app.bench.lockstep import ALONE, Lockstep
from eagletree.app.bench.profiling import (
    PROFILE_WARMUP_STEPS,
    ProfileCounts,
    profile_decode,
    synchronize,
)
from eagletree.app.engine.loop import Engine
from eagletree.domain.errors import EagleTreeError
from eagletree.domain.request import Request, RequestStatus
from eagletree.domain.sampling import SamplingParams


class MeasurementError(EagleTreeError, RuntimeError):
    """The batch could not be measured as asked; the message says why."""


def token_budget(
    new_tokens: int, warmup_steps: int, profile_steps: int, max_tokens_per_step: int
) -> int:
    """``max_new_tokens`` of each measured request: more than any request can emit while
    measured. The window ends once its slowest request has ``new_tokens`` and every step gives
    each running request at least one token, so it lasts at most ``new_tokens`` steps (one more
    with overlap); a request emits at most ``max_tokens_per_step`` a step, however far it runs
    ahead of the slowest (the profile runs one unrecorded step before its ``profile_steps``)."""
    profiled = profile_steps + PROFILE_WARMUP_STEPS if profile_steps > 0 else 0
    return (new_tokens + warmup_steps + profiled + 2) * max_tokens_per_step


@dataclass(frozen=True, slots=True)
class DecodeMeasurement:
    """The timed decode window of one batch, and the profiled steps after it."""

    batch_size: int
    num_steps: int
    num_tokens: int  # tokens generated in the window, all requests together
    seconds: float
    tokens_per_step: float  # per request and step: the mean acceptance length, 1 without drafts
    profile: ProfileCounts | None
    replica_batch_sizes: tuple[int, ...] = ()  # data-parallel: each replica's share, by replica
    # requests that finished (EOS, stop token, context) before the profile ended, and the first
    # one's reason: the window's later steps ran a smaller batch
    num_ended_early: int = 0
    ended_early_reason: str | None = None
    # each timed step's wall time, from one step's return to the next (this replica's clock)
    step_seconds: tuple[float, ...] = ()
    # an adaptive engine's: the shape each timed step launched (with overlap a step's time is
    # mostly the device's work on the one launched before it)
    step_shapes: tuple[str, ...] = ()
    # the tokens each timed step's return brought, all requests together (with overlap: those
    # of the step it read back, the one ``step_shapes`` names)
    step_tokens: tuple[int, ...] = ()
    # windows measured as one (``merged``): each one's tok/s, in order
    window_tokens_per_s: tuple[float, ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * self.seconds / self.num_steps if self.num_steps else 0.0


def merged(windows: Sequence[DecodeMeasurement]) -> DecodeMeasurement:
    """Windows of one batch size measured as one: their steps, tokens and seconds summed, the
    tokens per step over all steps, each window's tok/s, the first window's profile and
    data-parallel shares."""
    first = windows[0]
    num_steps = sum(w.num_steps for w in windows)
    reasons = [w.ended_early_reason for w in windows if w.ended_early_reason is not None]
    return replace(
        first,
        num_steps=num_steps,
        num_tokens=sum(w.num_tokens for w in windows),
        seconds=sum(w.seconds for w in windows),
        tokens_per_step=sum(w.tokens_per_step * w.num_steps for w in windows) / max(num_steps, 1),
        num_ended_early=sum(w.num_ended_early for w in windows),
        ended_early_reason=reasons[0] if reasons else None,
        step_seconds=tuple(t for w in windows for t in w.step_seconds),
        step_shapes=tuple(s for w in windows for s in w.step_shapes),
        step_tokens=tuple(n for w in windows for n in w.step_tokens),
        window_tokens_per_s=tuple(w.tokens_per_s for w in windows),
    )


def measure_decode(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    *,
    new_tokens: int,
    max_tokens_per_step: int,
    warmup_steps: int,
    profile_steps: int,
    cuda: bool,
    on_tokens: Callable[[int], None] = lambda done: None,
    max_new_tokens: int | None = None,
    lockstep: Lockstep = ALONE,
    trace: Path | None = None,
    temperature: float = 0.0,
    launched: Callable[[], str | None] | None = None,
) -> DecodeMeasurement:
    """Measure ``len(prompts)`` requests decoding together; ``on_tokens`` gets the tokens per
    request generated so far in the timed window after every step. ``max_new_tokens`` replaces
    the requests' default budget (``token_budget``). ``temperature`` > 0 samples (request i
    seeded with i, so runs repeat).

    With a data-parallel ``lockstep`` ``prompts`` are this replica's share of the batch (maybe
    none); the replicas step together and the measurement is the group's: its batch, its
    tokens, its slowest replica's seconds, the window ending when its slowest request has
    ``new_tokens``. The profile is this replica's; ``trace`` names a Chrome trace file for
    it (the profiled steps' host and device timelines). ``launched``: the shape of the step
    the engine launched last, read after every timed step (None, or its returning None: not
    recorded). With the engine's overlap, each timed step is named after the step launched
    before it, whose tokens it read back."""
    budget = max_new_tokens or token_budget(
        new_tokens, warmup_steps, profile_steps, max_tokens_per_step
    )
    seeded = temperature > 0
    requests = [
        engine.submit(
            prompt,
            SamplingParams(
                max_new_tokens=budget, temperature=temperature, seed=i if seeded else None
            ),
        )
        for i, prompt in enumerate(prompts)
    ]
    try:
        measurement = _measure(
            engine, requests, new_tokens, warmup_steps, profile_steps, cuda, on_tokens, lockstep,
            trace, launched,
        )  # fmt: skip
    except MeasurementError:  # raised on every replica together: they drain together too
        release_requests(engine, requests, lockstep)
        raise
    except BaseException:
        if not lockstep.grouped:  # a group's collectives would not match: the group ends
            release_requests(engine, requests, lockstep)
        raise
    release_requests(engine, requests, lockstep)
    return measurement


def _measure(
    engine: Engine,
    requests: list[Request],
    new_tokens: int,
    warmup_steps: int,
    profile_steps: int,
    cuda: bool,
    on_tokens: Callable[[int], None],
    lockstep: Lockstep,
    trace: Path | None,
    launched: Callable[[], str | None] | None,
) -> DecodeMeasurement:
    step_until(engine, lockstep, lambda: all(r.is_prefilled for r in requests), "prefill")
    retracted_before = engine.stats.num_retracted
    for _ in range(warmup_steps):
        lockstep.step(engine)
    outputs_before = [len(r.output_ids) for r in requests]
    emitted_before = [len(r.emitted_per_step) for r in requests]
    request_steps = num_steps = 0

    def generated() -> float:  # a replica without running requests never holds the window open
        new = [
            len(r.output_ids) - n
            for r, n in zip(requests, outputs_before, strict=True)
            if r.status is not RequestStatus.FINISHED
        ]
        return min(new, default=math.inf)

    synchronize(cuda)
    started = last = time.perf_counter()
    step_seconds = []
    step_shapes = []
    step_tokens = []
    committed = sum(outputs_before)
    # with overlap a step returns the tokens of the step launched before it, and waits for
    # them: its interval is that step's as much as its own, so it is named after that one
    shifted = launched is not None and engine.overlap
    read_back = launched() if launched is not None and shifted else None
    problem = None
    while True:
        least, all_kept = lockstep.minimum([generated(), problem is None])
        if num_steps:
            on_tokens(new_tokens if math.isinf(least) else int(least))
        if not all_kept:
            raise MeasurementError(lockstep.first_problem(problem))
        if least >= new_tokens:
            break
        request_steps += sum(r.status is RequestStatus.RUNNING for r in requests)
        lockstep.step(engine)  # reads a step's tokens back (with overlap: the previous one's)
        # no sync added: the step has waited for its tokens, so the clock between two returns
        # is the step a request sees, and the window's time is that of the loop unchanged
        now = time.perf_counter()
        step_seconds.append(now - last)
        last = now
        total = sum(len(r.output_ids) for r in requests)
        step_tokens.append(total - committed)
        committed = total
        shape = None if launched is None else launched()
        if shape is not None:
            step_shapes.append(read_back if shifted and read_back is not None else shape)
            read_back = shape
        num_steps += 1
        problem = retraction_problem(engine, retracted_before, "the timed decode steps")
    synchronize(cuda)
    seconds = time.perf_counter() - started
    mine = sum(len(r.output_ids) - n for r, n in zip(requests, outputs_before, strict=True))
    emitted = [  # tokens each speculative verify step emitted, per request
        count
        for r, n in zip(requests, emitted_before, strict=True)
        for count in r.emitted_per_step[n:]
    ]
    num_tokens, emitted_sum, emitted_count, steps_run = lockstep.total(
        [mine, sum(emitted), len(emitted), request_steps]
    )
    batches = lockstep.per_replica(len(requests))
    seconds = -lockstep.minimum([-seconds])[0]  # the slowest replica's window
    tokens_per_step = emitted_sum / emitted_count if emitted_count else num_tokens / steps_run
    counts = None
    (still_running,) = lockstep.total(
        [sum(r.status is not RequestStatus.FINISHED for r in requests)]
    )
    if profile_steps > 0 and still_running:  # nothing left to profile when every one ended
        counts = profile_decode(engine, profile_steps, cuda, lockstep, trace)
    problem = retraction_problem(engine, retracted_before, "the profiled steps")
    if not lockstep.minimum([problem is None])[0]:
        raise MeasurementError(lockstep.first_problem(problem))
    ended = [r for r in requests if r.status is RequestStatus.FINISHED]
    (num_ended,) = lockstep.total([len(ended)])
    return DecodeMeasurement(
        sum(batches),
        num_steps,
        int(num_tokens),
        seconds,
        tokens_per_step,
        counts,
        tuple(batches),
        int(num_ended),
        _reason(ended[0]) if ended else None,
        tuple(step_seconds),
        tuple(step_shapes),
        tuple(step_tokens),
    )


def _reason(request: Request) -> str:
    reason = request.finish_reason
    return "unknown" if reason is None else reason.value


def release_requests(engine: Engine, requests: Sequence[Request], lockstep: Lockstep) -> None:
    """Abort what is left of ``requests``, so that the engine can measure the next batch."""
    for request in requests:
        engine.abort(request.request_id)
    step_until(engine, lockstep, lambda: not engine.has_work(), "abort")


def step_until(engine: Engine, lockstep: Lockstep, done: Callable[[], bool], phase: str) -> None:
    for _ in range(100_000):
        all_done, all_idle = lockstep.minimum([done(), not engine.has_work()])
        if all_done:
            return
        if all_idle:
            raise MeasurementError(f"the engine ran out of work during {phase}")
        lockstep.step(engine)
    raise MeasurementError(f"{phase} did not finish in 100000 steps")


def retraction_problem(engine: Engine, retracted_before: int, phase: str) -> str | None:
    """Why the numbers would mean little (a retracted request recomputes its prefill inside the
    window), or None."""
    if engine.stats.num_retracted != retracted_before:
        return (
            f"requests were retracted during {phase}: the KV pool is too small for the batch "
            "(raise memory.max_total_tokens)"
        )
    return None


def running_problem(
    engine: Engine, requests: Sequence[Request], retracted_before: int, phase: str
) -> str | None:
    """Why a window that needs every one of ``requests`` running would mean less (one finished
    or was retracted), or None (the arrivals window's background batch)."""
    finished = [r for r in requests if r.status is RequestStatus.FINISHED]
    if finished:
        return (
            f"{len(finished)} request(s) finished during {phase} ({finished[0].finish_reason}) "
            "although their token budget was not spent"
        )
    return retraction_problem(engine, retracted_before, phase)
