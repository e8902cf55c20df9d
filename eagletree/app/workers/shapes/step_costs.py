"""The time of one decode step per draft shape, batch-size bucket and sampling.

An adaptive worker prices each candidate shape by what its step costs on this machine and this
model: at start, after its graphs are captured, every shape's step is replayed over padding
rows at every bucket, greedy and sampled (``measure_step_costs``); while it runs, the seconds
its steps actually take between read-backs (``ReadBackClock``) correct that table
(``learned_costs.LearnedCosts``), since a running step also pays the host's work, which a
replay does not.

A plain step comes in two kinds: one that leaves its token in the draft's lag, and the catch-up
that also extends the draft over the lag, once per lag width of plain steps and before a
drafting step that follows plain ones. Both are timed and learned apart, and a plain step is
priced as their mean over a run of plain steps: a catch-up timed as a plain step would price
plain decoding, at a batch of 64, at twice what a run of it costs.

A runner with no captured graphs runs its steps eagerly, which on a CPU takes a large share of a
second at a big bucket (the default set took 555 s on a 2-core CPU, timed as replays are):
it is timed once at three buckets (the smallest, the middle and the largest), warmed up at the
smallest only, and priced between them along straight lines in the batch size. The table is a
start; the learned costs correct it from the steps the engine runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eagletree.app.workers.sampler import SamplingMode

if TYPE_CHECKING:
    from eagletree.app.workers.step_graphs import DecodeStepRunner
    from eagletree.domain.draft_shape import DraftShape


_MODES = {False: SamplingMode.GREEDY, True: SamplingMode.SAMPLED}  # by ``sampled``


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Seconds of one step per (shape, bucket, sampled); ``buckets`` ascending. The plain
    shape's is a step that leaves its token in the draft's lag; ``catch_up`` per (bucket,
    sampled): a plain step that extends the draft over the lag, run once every
    ``catch_up_every`` plain steps (empty: plain steps need no catch-up)."""

    buckets: tuple[int, ...]
    seconds: Mapping[tuple[DraftShape, int, bool], float]
    catch_up: Mapping[tuple[int, bool], float] = field(default_factory=dict)
    catch_up_every: int = 1


def measure_step_costs(
    runners: Mapping[DraftShape, DecodeStepRunner],
    buckets: tuple[int, ...],
    *,
    catch_up: DecodeStepRunner | None = None,
    catch_up_every: int = 1,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
) -> StepCosts:
    """Time every runner's step, and ``catch_up``'s, at every bucket, greedy and sampled
    (start-up work; a line to ``progress`` after each runner: eager steps on the CPU take
    minutes over a set of shapes)."""
    started = time.perf_counter()
    kinds = [(bucket, sampled) for bucket in buckets for sampled in (False, True)]
    total = len(runners) + (catch_up is not None)

    def timed(runner: DecodeStepRunner, label: str, done: int) -> dict[tuple[int, bool], float]:
        """One runner's step at every bucket and sampling, then its progress line."""
        eager = runner.num_graphs == 0
        points = _eager_points(buckets) if eager else buckets
        times = {
            (bucket, sampled): runner.time_step(
                bucket,
                _MODES[sampled],
                1 if eager else repeats,
                warm_up=not eager or bucket == points[0],  # the eager step's first run
            )
            for bucket in points
            for sampled in (False, True)
        }
        if progress is not None:
            progress(f"measuring the step costs: {done}/{total} ({label})")
        return {(b, s): _between(times, points, b, s) for b, s in kinds}

    seconds = {
        (shape, bucket, sampled): t
        for done, (shape, runner) in enumerate(runners.items(), start=1)
        for (bucket, sampled), t in timed(runner, shape.label, done).items()
    }
    catch_ups = (
        {} if catch_up is None else timed(catch_up, "plain with the draft's catch-up", total)
    )
    if progress is not None:
        progress(
            f"measured the step costs of {len(runners)} draft shapes at {len(buckets)} batch "
            f"sizes in {time.perf_counter() - started:.1f} s"
        )
    return StepCosts(tuple(sorted(buckets)), seconds, catch_ups, catch_up_every)


def _eager_points(buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The buckets an eager runner is timed at: the smallest, the middle and the largest."""
    ordered = sorted(buckets)
    return tuple(sorted({ordered[0], ordered[len(ordered) // 2], ordered[-1]}))


def _between(
    times: Mapping[tuple[int, bool], float], points: tuple[int, ...], bucket: int, sampled: bool
) -> float:
    """The step time at ``bucket``: timed there, or on the straight line between the timed
    ``points`` on either side of it (``points`` ascending, spanning every bucket)."""
    if (bucket, sampled) in times:
        return times[bucket, sampled]
    upper = next(i for i, point in enumerate(points) if point > bucket)
    low, high = points[upper - 1], points[upper]
    weight = (bucket - low) / (high - low)
    return (1 - weight) * times[low, sampled] + weight * times[high, sampled]


class ReadBackClock:
    """How long each decode step took the engine: the interval between the read-backs of two
    consecutive steps. With overlap a read-back waits for its own step's end, the next step
    already queued behind it, so the interval is the step's device time when the device is the
    bottleneck and the host loop's when the host is; without overlap it is the whole
    iteration. Either way, what one more step of that kind costs."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._last: tuple[int, float] | None = None

    def lap(self, step: int) -> float | None:
        """Step number ``step`` was read back: the seconds since step ``step - 1`` was, or None
        when that one did not lap (a step between them was not timed: a prefill's alone)."""
        now = self._clock()
        last, self._last = self._last, (step, now)
        if last is None or last[0] != step - 1:
            return None
        return now - last[1]
