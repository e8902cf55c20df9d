"""A replayed step's seconds (``benchmarks.policy_replay``): drawn from the steps a GPU bench
run measured for that shape in that cell, optionally stretched where the run's host stalled
and lengthened (or shortened) after a switch of shape as the run's adaptive steps were."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping

from benchmarks.bench_run import Cell
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape


class StepClock:
    """A step's seconds, drawn from the cell's measured steps of its shape — those at the same
    place in their window where the caller says where in its window the step is (a step's time
    grows with its window's contexts); with ``host_stalls``, drawn from its calm steps (at most
    ``_CALM`` × its median) and stretched by the host's slowdown at that point of the cell's
    timeline (``_slowdowns``), whatever shape runs there, as a host that stalls stretches
    every shape's steps. With ``switches``, a step right after one of another shape takes the
    offset the cell's adaptive steps showed for that switch (``Cell.switch_offsets``)."""

    def __init__(
        self,
        cell: Cell,
        costs: StepCosts,
        rng: random.Random,
        host_stalls: bool = False,
        switches: bool = False,
    ) -> None:
        self._cell, self._rng = cell, rng
        self._offsets = cell.switch_offsets if switches else {}
        bucket = min(b for b in costs.buckets if b >= cell.batch_size)
        sampled = cell.temperature > 0
        plain = costs.seconds[(PLAIN, bucket, sampled)]
        self.catch_up_excess = max(0.0, costs.catch_up.get((bucket, sampled), plain) - plain)
        self._slowdowns: list[float] = []
        # the steps drawn from, per shape: every measured one, or with host stalls the calm ones
        self._drawn: dict[DraftShape, list[float]] = cell.seconds
        if host_stalls:
            medians = {s: statistics.median(seconds) for s, seconds in cell.seconds.items()}
            self._slowdowns = _slowdowns(cell, medians)
            self._drawn = {
                shape: [t for t in seconds if t <= _CALM * medians[shape]]
                for shape, seconds in cell.seconds.items()
            }
        self._at = rng.randrange(len(self._slowdowns)) if self._slowdowns else 0
        self._parts = {
            shape: _by_part(cell.seconds[shape], cell.windows.get(shape, 1), set(kept))
            for shape, kept in self._drawn.items()
        }

    def __call__(
        self,
        shape: DraftShape,
        catch_up: bool = False,
        place: float | None = None,
        after: DraftShape | None = None,
    ) -> float:
        """A step of ``shape`` (a catch-up's where ``catch_up``); ``place``: how far into its
        window the step is, from 0 (1 or more: its last part); ``after``: the shape of the step
        before it."""
        excess = self.catch_up_excess if catch_up else 0.0
        if after is not None:
            excess += self._offsets.get((after, shape), 0.0)
        pool = self._drawn[shape]
        if place is not None:
            part = self._parts[shape][min(_PARTS - 1, int(place * _PARTS))]
            pool = part or pool
        if not self._slowdowns:
            return self._rng.choice(pool) + excess
        self._at = (self._at + 1) % len(self._slowdowns)
        return (self._rng.choice(pool) + excess) * self._slowdowns[self._at]

    def mean(self, shape: DraftShape, catch_up: bool = False) -> float:
        measured = self._cell.seconds[shape]
        return sum(measured) / len(measured) + (self.catch_up_excess if catch_up else 0.0)


# a measured step over this many times its row's median ran while the host stalled
_CALM = 1.4
# the parts of a window a step is drawn by its place in: on the H100 a fixed engine's median
# step rose 4-5 % from its windows' first quarter to their last, as the contexts grew
_PARTS = 8


def _by_part(seconds: list[float], windows: int, kept: set[float]) -> list[list[float]]:
    """A row's steps (those in ``kept``) by the part of its window each ran in, the row's
    ``windows`` windows of equal steps."""
    per_window = max(1, len(seconds) // windows)
    parts: list[list[float]] = [[] for _ in range(_PARTS)]
    for index, step in enumerate(seconds):
        if step in kept:
            parts[min(_PARTS - 1, (index % per_window) * _PARTS // per_window)].append(step)
    return parts


def _slowdowns(cell: Cell, medians: Mapping[DraftShape, float]) -> list[float]:
    """The cell's fixed rows one after the other, each step as its share of its row's median
    (``medians``) where it is a stall (over ``_CALM``), else 1: the host's slowdowns as the
    GPU met them."""
    timeline = []
    for shape, seconds in cell.seconds.items():
        median = medians[shape]
        timeline += [t / median if t > _CALM * median else 1.0 for t in seconds]
    return timeline
