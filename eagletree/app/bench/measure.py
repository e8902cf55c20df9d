"""Application: time and profile steady decode steps of an engine, prefill excluded.

One measurement submits a batch of prompts, steps until every request is prefilled, runs a few
warm-up steps (kernels compile, the allocator settles), times the decode steps that generate
``new_tokens`` tokens per request, then runs ``profile_steps`` more under ``torch.profiler``.
The requests get a token budget large enough that none finishes inside the measured window;
what is left is aborted afterwards, so the engine can measure the next batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from eagletree.app.bench.device_gaps import DeviceGaps, device_gaps
from eagletree.app.bench.lockstep import ALONE, Lockstep
from eagletree.app.engine.loop import Engine
from eagletree.domain.errors import EagleTreeError
from eagletree.domain.request import Request, RequestStatus
from eagletree.domain.sampling_params import SamplingParams

PROFILE_WARMUP_STEPS = 1  # run under the profiler before the recorded ones, unrecorded


class MeasurementError(EagleTreeError, RuntimeError):
    """The batch could not be measured as asked; the message says why."""


def token_budget(
    new_tokens: int, warmup_steps: int, profile_steps: int, max_tokens_per_step: int
) -> int:
    """``max_new_tokens`` of each measured request: enough that none finishes while measured
    (the profile runs one unrecorded step before its ``profile_steps``)."""
    profiled = profile_steps + PROFILE_WARMUP_STEPS if profile_steps > 0 else 0
    return new_tokens + (warmup_steps + profiled + 2) * max_tokens_per_step


@dataclass(frozen=True, slots=True)
class ProfileCounts:
    """Per-step counts from the profiler. On CUDA ``launches`` are device activities (kernels,
    copies, memsets) and ``device_ms`` their summed duration; on the CPU ``launches`` are the
    top-level aten operators (what Python dispatches) and there is no device time."""

    num_steps: int
    launches_per_step: float
    device_ms_per_step: float | None
    wall_ms_per_step: float  # under the profiler, so slower than the timed steps
    # CUDA: the kernels that took the most device time, (name, launches/step, ms/step)
    top_kernels: tuple[tuple[str, float, float], ...] = ()
    gaps: DeviceGaps | None = None  # CUDA: where the device sat idle between its activities


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

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * self.seconds / self.num_steps if self.num_steps else 0.0


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
) -> DecodeMeasurement:
    """Measure ``len(prompts)`` requests decoding together; ``on_tokens`` gets the tokens per
    request generated so far in the timed window after every step. ``max_new_tokens`` replaces
    the requests' default budget (``token_budget``), which assumes they advance alike — real
    drafts do not: one request may emit ``max_tokens_per_step`` a step while the slowest,
    which decides when the window ends, emits one.

    With a data-parallel ``lockstep`` ``prompts`` are this replica's share of the batch (maybe
    none); the replicas step together and the measurement is the group's: its batch, its
    tokens, its slowest replica's seconds, the window ending when its slowest request has
    ``new_tokens``. The profile is this replica's; ``trace`` names a Chrome trace file for
    it (the profiled steps' host and device timelines)."""
    budget = max_new_tokens or token_budget(
        new_tokens, warmup_steps, profile_steps, max_tokens_per_step
    )
    requests = [engine.submit(prompt, SamplingParams(max_new_tokens=budget)) for prompt in prompts]
    try:
        measurement = _measure(
            engine, requests, new_tokens, warmup_steps, profile_steps, cuda, on_tokens, lockstep,
            trace,
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
) -> DecodeMeasurement:
    step_until(engine, lockstep, lambda: all(r.is_prefilled for r in requests), "prefill")
    retracted_before = engine.stats.num_retracted
    for _ in range(warmup_steps):
        lockstep.step(engine)
    outputs_before = [len(r.output_ids) for r in requests]
    emitted_before = [len(r.emitted_per_step) for r in requests]
    request_steps = num_steps = 0

    def generated() -> float:  # a replica without requests never holds the window open
        new = [len(r.output_ids) - n for r, n in zip(requests, outputs_before, strict=True)]
        return min(new, default=math.inf)

    synchronize(cuda)
    started = time.perf_counter()
    problem = None
    while True:
        least, all_running = lockstep.minimum([generated(), problem is None])
        if num_steps:
            on_tokens(int(least))
        if not all_running:
            raise MeasurementError(lockstep.first_problem(problem))
        if least >= new_tokens:
            break
        request_steps += sum(r.status is RequestStatus.RUNNING for r in requests)
        lockstep.step(engine)  # reads a step's tokens back (with overlap: the previous one's)
        num_steps += 1
        problem = running_problem(engine, requests, retracted_before, "the timed decode steps")
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
    if profile_steps > 0:
        counts = profile_decode(engine, profile_steps, cuda, lockstep, trace)
    problem = running_problem(engine, requests, retracted_before, "the profiled steps")
    if not lockstep.minimum([problem is None])[0]:
        raise MeasurementError(lockstep.first_problem(problem))
    return DecodeMeasurement(
        sum(batches), num_steps, int(num_tokens), seconds, tokens_per_step, counts, tuple(batches)
    )


def release_requests(engine: Engine, requests: Sequence[Request], lockstep: Lockstep) -> None:
    """Abort what is left of ``requests``, so that the engine can measure the next batch."""
    for request in requests:
        engine.abort(request.request_id)
    step_until(engine, lockstep, lambda: not engine.has_work(), "abort")


def profile_decode(
    engine: Engine,
    num_steps: int,
    cuda: bool,
    lockstep: Lockstep = ALONE,
    trace: Path | None = None,
) -> ProfileCounts:
    """Run ``num_steps`` steps under ``torch.profiler`` and count what each one launched;
    ``trace``: also write the profile as a Chrome trace there. One step before them runs
    under the profiler unrecorded, so the recorded steps start with the device still busy, as
    in steady decoding (after a synchronisation the first step's host work would count as
    device idle time); what that step runs on the device inside the window is not counted."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    recorded = schedule(wait=0, warmup=PROFILE_WARMUP_STEPS, active=num_steps, repeat=1)
    with profile(activities=activities, schedule=recorded) as profiler:
        for _ in range(PROFILE_WARMUP_STEPS):
            lockstep.step(engine)
            profiler.step()
        started = time.perf_counter()
        for i in range(num_steps):
            lockstep.step(engine)
            if i == num_steps - 1:
                synchronize(cuda)  # the recorded steps' kernels end inside the window
            profiler.step()
        wall_s = time.perf_counter() - started
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(trace))
    events = launched_in_window(profiler.events())
    launches, device_ms = count_launches(events, cuda)
    return ProfileCounts(
        num_steps,
        launches / num_steps,
        None if device_ms is None else device_ms / num_steps,
        1000.0 * wall_s / num_steps,
        top_kernels(events, num_steps) if cuda else (),
        device_gaps(device_spans(events), num_steps) if cuda else None,
    )


def launched_in_window(events: Sequence[Any]) -> list[Any]:
    """``events`` without the device activities that a step launched before the recording.

    With the host one step ahead, the device still runs the unrecorded step when recording
    starts, and the profiler records what of it executes from then on. Such an activity's
    launch (the runtime or driver call sharing its correlation id) is not among the recorded
    host events, so it is dropped. A profile without launch calls (the CPU) is kept whole."""
    launched = {e.id for e in events if _is_launch_call(e)}
    if not launched:
        return list(events)
    return [e for e in events if not _is_device_activity(e) or e.id in launched]


def device_spans(events: Iterable[Any]) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every device activity among profiler events."""
    return [
        (e.time_range.start, e.time_range.end, e.name) for e in events if _is_device_activity(e)
    ]


def top_kernels(
    events: Iterable[Any], num_steps: int, limit: int = 12
) -> tuple[tuple[str, float, float], ...]:
    """The ``limit`` device activities with the most summed time, grouped by name, per step."""
    totals: dict[str, list[float]] = {}
    for event in events:
        if _is_device_activity(event):
            entry = totals.setdefault(event.name, [0.0, 0.0])
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us() / 1000.0
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:limit]
    return tuple((name[:80], count / num_steps, ms / num_steps) for name, (count, ms) in ranked)


def count_launches(events: Iterable[Any], cuda: bool) -> tuple[int, float | None]:
    """(launches, device ms) of profiler events: device activities and their summed time on
    CUDA; top-level aten operators and no time on the CPU."""
    if not cuda:
        return sum(_is_top_level_aten(e) for e in events), None
    device = [e for e in events if _is_device_activity(e)]
    return len(device), sum(e.time_range.elapsed_us() for e in device) / 1000.0


def _is_device_activity(event: Any) -> bool:
    """A kernel, copy or memset on the GPU; GPU-side spans of ``record_function`` ranges are
    device events too, but they overlap the kernels inside them and launch nothing."""
    if event.device_type.name != "CUDA" or getattr(event, "is_user_annotation", False):
        return False
    return "annotation" not in str(getattr(event, "activity_type", "")).lower()


def _is_launch_call(event: Any) -> bool:
    """A CUDA runtime or driver call (``cudaLaunchKernel``, ``cudaGraphLaunch``,
    ``cuLaunchKernel``, ``cudaMemcpyAsync``, …): the host side of device activities, which
    share its correlation id."""
    name: str = getattr(event, "name", "")
    return event.device_type.name == "CPU" and name.startswith("cu") and event.id > 0


def _is_top_level_aten(event: object) -> bool:
    name: str = getattr(event, "name", "")
    if not name.startswith("aten::"):
        return False
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if getattr(parent, "name", "").startswith("aten::"):
            return False
        parent = getattr(parent, "cpu_parent", None)
    return True


def synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()  # SYNC: the wall clock must cover the queued kernels


def step_until(engine: Engine, lockstep: Lockstep, done: Callable[[], bool], phase: str) -> None:
    for _ in range(100_000):
        all_done, all_idle = lockstep.minimum([done(), not engine.has_work()])
        if all_done:
            return
        if all_idle:
            raise MeasurementError(f"the engine ran out of work during {phase}")
        lockstep.step(engine)
    raise MeasurementError(f"{phase} did not finish in 100000 steps")


def running_problem(
    engine: Engine, requests: Sequence[Request], retracted_before: int, phase: str
) -> str | None:
    """Why the numbers would mean less (every request must decode through the whole window),
    or None."""
    finished = [r for r in requests if r.status is RequestStatus.FINISHED]
    if finished:
        return (
            f"{len(finished)} request(s) finished during {phase} ({finished[0].finish_reason}) "
            "although their token budget was not spent"
        )
    if engine.stats.num_retracted != retracted_before:
        return (
            f"requests were retracted during {phase}: the KV pool is too small for the batch "
            "(raise memory.max_total_tokens)"
        )
    return None
