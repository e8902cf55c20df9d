"""Step costs as the running engine pays them: the measured table (``step_costs.StepCosts``)
corrected by the seconds each step took between read-backs, learnt per shape, bucket and
sampling, with a host stall left out."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.app.workers.step_graphs import bucket_for
from eagletree.domain.draft_shape import PLAIN

if TYPE_CHECKING:
    from eagletree.domain.draft_shape import DraftShape


@dataclass(slots=True)
class _Smoothed:
    """A running mean that follows drift: the plain mean of its first ``1 / weight`` samples,
    then an exponential average of weight ``weight``."""

    mean: float
    count: int = 0

    def add(self, value: float, weight: float) -> None:
        self.count += 1
        plain_mean = 1.0 / self.count
        self.mean += (weight if weight > plain_mean else plain_mean) * (value - self.mean)


_Key = tuple["DraftShape", int, bool, bool]  # shape, bucket, sampled, a plain step's catch-up

# the least share of its measured seconds a step not yet run is priced at: a table that
# overstates the steps (measured on a loaded host, or before the clocks rose) leaves a negative
# excess, and one borrowed whole from a larger bucket or a dearer shape could price a step at
# nothing or less (on the CPU a plain step at bucket 24 came to -0.2 ms from bucket 32's excess,
# and no candidate was left to choose)
_FLOOR = 0.25
# the steps at a bucket and sampling that teach nothing but its median (``LearnedCosts``)
WARM_AFTER = 8


class LearnedCosts:
    """Step costs as the running engine pays them: the ``measured`` table corrected by the seconds
    steps took (``record``; ``ReadBackClock``). docs/speculative.md ("Costs") gives the runs
    behind each rule.

    A replayed graph times the device alone; a running step also pays the host's work, which
    differs far less between shapes, so the table alone overprices drafting against plain
    steps. A (shape, bucket, sampling) that ran is priced by the smoothed seconds it took
    (``weight``: how fast the average follows a change; its estimate counts as the first
    sample). One that has not is priced by its measured seconds plus the excess of observed
    over measured seconds of its kind — plain steps with their catch-ups, or drafting steps,
    kept apart because a drafting step's host share is the larger — at its bucket and sampling,
    else at the nearest bucket where one ran, else with the other sampling; where none of its
    kind ran at all a drafting shape borrows the plain steps' excess and a plain step has none
    (an estimate too low is corrected when the step runs, one too high never is). Such a price
    is never below ``_FLOOR`` of the table's. Plain steps and their catch-ups are learned apart
    and a plain step is priced as their mean over a run (``StepCosts``).

    A step over ``clip`` times its estimate counts as that (an engine that waited between two
    steps); one over ``stall_over`` times both its shape's average and the median step at its
    bucket is not learned from at all (``_stalled``: a host that stalled). A shape's own times
    go stale once ``stale_after`` steps were recorded since its last, and it is priced by the
    table and the excess again (a shape that stopped running would otherwise keep whatever its
    last steps said, and never say otherwise). ``median_step``: the median of the last
    ``recent_steps`` steps at a bucket and sampling, whatever their shape, or at the nearest
    smaller bucket before its first (the adaptive policy's stall limit). ``warm_after``: the
    first steps at a bucket and sampling teach nothing but its median (an engine's first steps
    pay one-time host work); nor does a step right after a drafting step of another shape,
    which pays part of that step's host work.
    """

    def __init__(
        self,
        measured: StepCosts,
        *,
        weight: float = 0.1,
        clip: float = 3.0,
        stall_over: float = 1.5,
        stale_after: int = 16,
        recent_steps: int = 64,
        warm_after: int = WARM_AFTER,
    ) -> None:
        self.measured = measured
        self._warm_after = warm_after
        self._weight = weight
        self._clip = clip
        self._stall_over = stall_over
        self._stale_after = stale_after
        self._observed: dict[_Key, _Smoothed] = {}
        # per (shape, bucket, sampled), the record count at its last step (a plain step's and
        # a catch-up's alike: a run of plain steps keeps both kinds fresh)
        self._recorded_at: dict[tuple[DraftShape, int, bool], int] = {}
        self._records = 0
        self._last_drafting: DraftShape | None = None  # the last step's shape, if it drafted
        # per (bucket, sampled, plain): the excess of plain steps (and catch-ups) and that of
        # drafting steps, apart (a drafting step's host work is the larger by far)
        self._excess: dict[tuple[int, bool, bool], _Smoothed] = {}
        # per (bucket, sampled, plain) the excess it borrows, found once per new observed bucket
        self._borrowed: dict[tuple[int, bool, bool], _Smoothed | None] = {}
        # per (bucket, sampled): the last ``recent_steps`` steps of every shape (catch-ups too)
        # as requests met them, in order and sorted (for their median)
        self._recent_steps = recent_steps
        self._recent: dict[tuple[int, bool], tuple[deque[float], list[float]]] = {}
        # the bucket of every batch size up to the largest (read a few times every step)
        largest = measured.buckets[-1]
        self._bucket_of = [bucket_for(size, measured.buckets) for size in range(largest + 1)]

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.measured.buckets

    def bucket(self, batch_size: int) -> int:
        """The bucket whose costs price a step of ``batch_size`` requests (above the largest:
        the largest's, scaled by the rows)."""
        return self._key(PLAIN, batch_size, False)[0][1]

    def of(self, shape: DraftShape, batch_size: int, sampled: bool) -> float:
        """The expected seconds of one step of ``shape`` over ``batch_size`` requests (a plain
        step: its share of a run of plain steps with their catch-ups)."""
        key, rows = self._key(shape, batch_size, sampled)
        return self._run_mean(key, self._per_bucket) * rows

    def catch_up_excess(self, batch_size: int, sampled: bool) -> float:
        """How much longer a catch-up takes over ``batch_size`` requests than a plain step
        that leaves its token in the lag (0 where plain steps need no catch-up)."""
        if not self.measured.catch_up:
            return 0.0
        (_, bucket, _, _), rows = self._key(PLAIN, batch_size, sampled)
        lagging = self._per_bucket((PLAIN, bucket, sampled, False))
        return max(0.0, self._per_bucket((PLAIN, bucket, sampled, True)) - lagging) * rows

    def measured_of(self, shape: DraftShape, batch_size: int, sampled: bool) -> float:
        """``of`` by the measured table alone."""
        key, rows = self._key(shape, batch_size, sampled)
        return self._run_mean(key, self._measured) * rows

    def median_step(self, batch_size: int, sampled: bool) -> float | None:
        """The median seconds of the last ``recent_steps`` steps recorded at this batch size's
        bucket and sampling, whatever their shape: the step a request there has mostly been
        waiting. Before the bucket's first step, the nearest smaller bucket's that has steps
        (a larger batch's steps take no less), else None: a batch that grows into a bucket
        has been waiting steps like those, where a limit from the cheapest step alone may
        refuse its best shape for its first pricing (docs/speculative.md, "No stalls")."""
        (_, bucket, _, _), rows = self._key(PLAIN, batch_size, sampled)
        buckets = self.measured.buckets
        for below in reversed(buckets[: buckets.index(bucket) + 1]):
            recent = self._recent.get((below, sampled))
            if recent is not None:
                ordered = recent[1]
                return ordered[len(ordered) // 2] * rows
        return None

    def observations(self, shape: DraftShape, batch_size: int, sampled: bool) -> int:
        """How many steps of ``shape`` were recorded at this batch size's bucket and sampling
        (for plain: those that left their token in the lag)."""
        observed = self._fresh(self._key(shape, batch_size, sampled)[0])
        return 0 if observed is None else observed.count - 1  # its estimate counts as one

    def record(
        self,
        shape: DraftShape,
        batch_size: int,
        sampled: bool,
        seconds: float,
        *,
        catch_up: bool = False,
    ) -> None:
        """A step of ``shape`` over ``batch_size`` requests took ``seconds``; ``catch_up``: a
        plain step that also extended the draft over its lag."""
        key, rows = self._key(shape, batch_size, sampled)
        bucket = key[1]
        if catch_up:
            key = (shape, bucket, sampled, True)
        recent = self._recent.get((bucket, sampled))
        if recent is None:
            recent = self._recent[(bucket, sampled)] = (deque(), [])
        window, ordered = recent
        # a step right after a drafting step of another shape paid part of that one's host work
        last, self._last_drafting = self._last_drafting, None if shape.is_plain else shape
        after_other = last is not None and last != shape  # equality tests identity first
        teaches = not after_other and len(window) >= self._warm_after
        observed = self._fresh(key)
        if observed is None and teaches:  # a new average, its estimate the first sample
            observed = self._observed[key] = _Smoothed(self._per_bucket(key), 1)
        per_row = seconds / rows
        estimate = self._per_bucket(key) if observed is None else observed.mean
        value = min(per_row, self._clip * estimate)
        stalled = observed is not None and teaches and self._stalled(per_row, observed, ordered)
        window.append(value)
        bisect.insort(ordered, value)
        if len(window) > self._recent_steps:
            del ordered[bisect.bisect_left(ordered, window.popleft())]
        self._records += 1
        if observed is None or not teaches:
            return
        self._recorded_at[key[:3]] = self._records
        if stalled:
            return
        observed.add(value, self._weight)
        kind = (bucket, sampled, shape.is_plain)
        excess = self._excess.get(kind)
        if excess is None:
            excess = self._excess[kind] = _Smoothed(0.0)
            self._borrowed.clear()
        excess.add(value - self._measured(key), self._weight)

    def _stalled(self, seconds: float, observed: _Smoothed, recent: list[float]) -> bool:
        """Whether a step of ``seconds`` (as it took, before the clip) ran while the host
        stalled or the caller paused before reading it back: over ``stall_over`` times both
        its shape's average and the median of the recent steps at its bucket (eight at least),
        or, while the average is young (under three steps: it may still be an estimate far too
        low), over ``clip`` times both. Such a step says nothing of what its shape costs, only
        that the shape ran. Tested before the clip: a plain step clipped to 3 x its 0.55 ms is
        within 1.5 x the 1.2 ms median of the drafting steps around it, and a bench's pause
        between its windows, read back on a plain step of a T 1 batch of 64, priced plain
        steps 11 % over their time in a replay of that cell's steps (the H100 run's policy
        ended pricing them at 0.83 ms where they took 0.58) and kept it on chain S3."""
        if len(recent) < 8:
            return False
        reference = max(observed.mean, recent[len(recent) // 2])
        limit = self._stall_over if observed.count >= 3 else self._clip
        return seconds > limit * reference

    def _run_mean(self, key: _Key, per_bucket: Callable[[_Key], float]) -> float:
        """A step's seconds at its bucket; a plain one's, amortised over a run of plain steps
        that catch the draft up once every ``catch_up_every``."""
        shape, bucket, sampled, _ = key
        every = self.measured.catch_up_every
        if not shape.is_plain or not self.measured.catch_up:
            return per_bucket(key)
        catch_up = per_bucket((shape, bucket, sampled, True))
        return ((every - 1) * per_bucket(key) + catch_up) / every

    def _measured(self, key: _Key) -> float:
        shape, bucket, sampled, catch_up = key
        if catch_up:
            return self.measured.catch_up[(bucket, sampled)]
        return self.measured.seconds[(shape, bucket, sampled)]

    def _fresh(self, key: _Key) -> _Smoothed | None:
        """The key's own average, unless ``stale_after`` steps were recorded since its shape
        last ran at its bucket and sampling."""
        observed = self._observed.get(key)
        if observed is None or self._records - self._recorded_at[key[:3]] >= self._stale_after:
            return None
        return observed

    def _per_bucket(self, key: _Key) -> float:
        observed = self._fresh(key)
        if observed is not None:
            return observed.mean
        shape, bucket, sampled, _ = key
        plain = shape.is_plain
        excess = self._excess_at(bucket, sampled, plain)
        if excess is None:  # none of its kind ran with its sampling: with the other one
            excess = self._excess_at(bucket, not sampled, plain)
        if excess is None and not plain:  # no drafting step ran yet: plain steps' excess
            excess = self._excess_at(bucket, sampled, True)
        measured = self._measured(key)
        return max(measured + (0.0 if excess is None else excess.mean), _FLOOR * measured)

    def _excess_at(self, bucket: int, sampled: bool, plain: bool) -> _Smoothed | None:
        """The excess of ``plain`` steps (else drafting ones) seen at ``bucket``, else at the
        nearest bucket where one of that kind and sampling ran (the smaller of two as near),
        else None."""
        kind = (bucket, sampled, plain)
        own = self._excess.get(kind)
        if own is not None:
            return own
        if kind not in self._borrowed:
            seen = [b for b, s, p in self._excess if s == sampled and p == plain]
            nearest = min(seen, key=lambda b: (abs(b - bucket), b), default=None)
            self._borrowed[kind] = (
                None if nearest is None else self._excess[(nearest, sampled, plain)]
            )
        return self._borrowed[kind]

    def _key(self, shape: DraftShape, batch_size: int, sampled: bool) -> tuple[_Key, float]:
        """The table's key for a step (not a catch-up) and the factor its time is the bucket's
        by: 1 within the buckets; above the largest, its rows over the largest's (an eager step
        past the graphs costs at least that)."""
        if batch_size >= len(self._bucket_of):
            largest = self.buckets[-1]
            return (shape, largest, sampled, False), batch_size / largest
        bucket = self._bucket_of[batch_size]
        assert bucket is not None, "a step of no requests has no cost"
        return (shape, bucket, sampled, False), 1.0
