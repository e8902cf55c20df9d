"""Application: what a few decode steps launch, from ``torch.profiler``: launches and device
time per step, the costliest kernels and the device's idle gaps (CUDA), or the top-level aten
operators Python dispatched (the CPU)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from eagletree.app.bench.device_gaps import DeviceGaps, device_gaps
from eagletree.app.bench.lockstep import ALONE, Lockstep
from eagletree.app.engine.loop import Engine

PROFILE_WARMUP_STEPS = 1  # run under the profiler before the recorded ones, unrecorded


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


def profile_decode(
    engine: Engine,
    num_steps: int,
    cuda: bool,
    lockstep: Lockstep = ALONE,
    trace: Path | None = None,
    top: int = 12,
) -> ProfileCounts:
    """Run ``num_steps`` steps under ``torch.profiler`` and count what each one launched;
    ``trace``: also write the profile as a Chrome trace there; ``top``: how many of the
    costliest kernels to keep. One step before them runs under the profiler unrecorded, so the
    recorded steps start with the device still busy, as in steady decoding (after a
    synchronisation the first step's host work would count as device idle time); what that step
    runs on the device inside the window is not counted."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    recorded = schedule(wait=0, warmup=PROFILE_WARMUP_STEPS, active=num_steps, repeat=1)
    untimed = engine.worker.untimed_steps()  # they teach an adaptive policy no step's cost
    with untimed, profile(activities=activities, schedule=recorded) as profiler:
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
        top_kernels(events, num_steps, top) if cuda else (),
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
