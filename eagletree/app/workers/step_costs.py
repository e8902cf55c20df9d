"""The time of one decode step per draft shape, batch-size bucket and sampling.

An adaptive worker prices each candidate shape by what its step costs on this machine and this
model: at start, after its graphs are captured, every shape's step is replayed over padding
rows at every bucket, greedy and sampled (``measure_step_costs``); while it runs, the seconds
its steps actually take between read-backs (``ReadBackClock``) correct that table
(``LearnedCosts``), since a running step also pays the host's work, which a replay does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagletree.app.workers.sampler import SamplingMode
from eagletree.app.workers.step_graphs import bucket_for

if TYPE_CHECKING:
    from eagletree.app.workers.step_graphs import DecodeStepRunner
    from eagletree.domain.draft_shape import DraftShape


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Seconds of one step per (shape, bucket, sampled); ``buckets`` ascending."""

    buckets: tuple[int, ...]
    seconds: Mapping[tuple[DraftShape, int, bool], float]

    def amortised(self, shape: DraftShape, once: StepCosts, every: int) -> StepCosts:
        """These costs with ``shape``'s step replaced by the mean over ``every`` steps of which
        one costs ``once``'s (same buckets) and the rest this table's: a run of plain steps that
        catch the draft up once per lag width."""
        seconds = dict(self.seconds)
        for (other, bucket, sampled), extra in once.seconds.items():
            key = (shape, bucket, sampled)
            seconds[key] = ((every - 1) * self.seconds[key] + extra) / every
            assert other == shape, "amortised over the same shape's costs"
        return StepCosts(self.buckets, seconds)


def measure_step_costs(
    runners: Mapping[DraftShape, DecodeStepRunner],
    buckets: tuple[int, ...],
    *,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
) -> StepCosts:
    """Time every runner's step at every bucket, greedy and sampled (start-up work)."""
    started = time.perf_counter()
    seconds = {
        (shape, bucket, sampled): runner.time_step(
            bucket, SamplingMode.SAMPLED if sampled else SamplingMode.GREEDY, repeats
        )
        for shape, runner in runners.items()
        for bucket in buckets
        for sampled in (False, True)
    }
    if progress is not None:
        progress(
            f"measured the step costs of {len(runners)} draft shapes at {len(buckets)} batch "
            f"sizes in {time.perf_counter() - started:.1f} s"
        )
    return StepCosts(tuple(sorted(buckets)), seconds)


@dataclass(slots=True)
class _Smoothed:
    """A running mean that follows drift: the plain mean of its first ``1 / weight`` samples,
    then an exponential average of weight ``weight``."""

    mean: float
    count: int = 0

    def add(self, value: float, weight: float) -> None:
        self.count += 1
        self.mean += max(weight, 1.0 / self.count) * (value - self.mean)


class LearnedCosts:
    """Step costs as the running engine pays them: the ``measured`` table corrected by the
    seconds steps took (``record``; ``ReadBackClock``).

    A replayed graph times the device alone; a running step also pays the host's work
    (scheduling, commits, the policy) and, for plain steps, their share of the draft's
    catch-ups: on a small model that is most of a step, and it differs far less between shapes
    than the device's time does, so the measured table alone overprices drafting against plain
    steps. A (shape, bucket, sampling) that ran is priced by the smoothed seconds it took,
    starting from its estimate as one sample; one that has not, by its measured seconds plus
    the excess of observed over measured seconds at its bucket and sampling (smoothed over
    whatever ran there: the host's share is additive), or where nothing ran there yet, at the
    nearest bucket where something did (the host's share changes slowly with the batch, and a
    serving batch moves between buckets as requests come and go). A step that took more than
    ``clip`` times its estimate counts as that (an engine that waited between two steps);
    ``weight``: how fast an average follows a change.
    """

    def __init__(self, measured: StepCosts, *, weight: float = 0.1, clip: float = 3.0) -> None:
        self.measured = measured
        self._weight = weight
        self._clip = clip
        self._observed: dict[tuple[DraftShape, int, bool], _Smoothed] = {}
        self._excess: dict[tuple[int, bool], _Smoothed] = {}
        # per (bucket, sampling) the excess it borrows, found once per new observed bucket
        self._borrowed: dict[tuple[int, bool], _Smoothed | None] = {}
        # the bucket of every batch size up to the largest (read a few times every step)
        largest = measured.buckets[-1]
        self._bucket_of = [bucket_for(size, measured.buckets) for size in range(largest + 1)]

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.measured.buckets

    def of(self, shape: DraftShape, batch_size: int, sampled: bool) -> float:
        """The expected seconds of one step of ``shape`` over ``batch_size`` requests."""
        key, rows = self._key(shape, batch_size, sampled)
        return self._per_bucket(key) * rows

    def observations(self, shape: DraftShape, batch_size: int, sampled: bool) -> int:
        """How many steps of ``shape`` were recorded at this batch size's bucket and sampling."""
        observed = self._observed.get(self._key(shape, batch_size, sampled)[0])
        return 0 if observed is None else observed.count - 1  # its estimate counts as one

    def record(self, shape: DraftShape, batch_size: int, sampled: bool, seconds: float) -> None:
        """A step of ``shape`` over ``batch_size`` requests took ``seconds``."""
        key, rows = self._key(shape, batch_size, sampled)
        estimate = self._per_bucket(key)
        value = min(seconds / rows, self._clip * estimate)
        observed = self._observed.setdefault(key, _Smoothed(estimate, 1))
        observed.add(value, self._weight)
        excess = self._excess.get(key[1:])
        if excess is None:
            excess = self._excess[key[1:]] = _Smoothed(0.0)
            self._borrowed.clear()
        excess.add(value - self.measured.seconds[key], self._weight)

    def _per_bucket(self, key: tuple[DraftShape, int, bool]) -> float:
        observed = self._observed.get(key)
        if observed is not None:
            return observed.mean
        excess = self._excess_at(key[1], key[2])
        return self.measured.seconds[key] + (0.0 if excess is None else excess.mean)

    def _excess_at(self, bucket: int, sampled: bool) -> _Smoothed | None:
        """The excess seen at ``bucket``, else at the nearest bucket where a step of that
        sampling ran (the smaller of two as near), else None."""
        own = self._excess.get((bucket, sampled))
        if own is not None:
            return own
        if (bucket, sampled) not in self._borrowed:
            seen = [b for b, s in self._excess if s == sampled]
            nearest = min(seen, key=lambda b: (abs(b - bucket), b), default=None)
            self._borrowed[(bucket, sampled)] = (
                None if nearest is None else self._excess[(nearest, sampled)]
            )
        return self._borrowed[(bucket, sampled)]

    def _key(
        self, shape: DraftShape, batch_size: int, sampled: bool
    ) -> tuple[tuple[DraftShape, int, bool], float]:
        """The table's key for a step and the factor its time is the bucket's by: 1 within the
        buckets; above the largest, its rows over the largest's (an eager step past the graphs
        costs at least that)."""
        if batch_size >= len(self._bucket_of):
            largest = self.buckets[-1]
            return (shape, largest, sampled), batch_size / largest
        bucket = self._bucket_of[batch_size]
        assert bucket is not None, "a step of no requests has no cost"
        return (shape, bucket, sampled), 1.0


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
