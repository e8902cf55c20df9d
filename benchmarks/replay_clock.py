"""A replayed step's seconds (``benchmarks.policy_replay``): drawn from the steps a GPU bench
run measured for that shape in that cell, optionally stretched where the run's host stalled."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping

from benchmarks.bench_run import Cell
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape


class StepClock:
    """A step's seconds, drawn from the cell's measured steps of its shape; with
    ``host_stalls``, drawn from its calm steps (at most ``_CALM`` × its median) and stretched
    by the host's slowdown at that point of the cell's timeline (``_slowdowns``), whatever
    shape runs there, as a host that stalls stretches every shape's steps."""

    def __init__(
        self, cell: Cell, costs: StepCosts, rng: random.Random, host_stalls: bool = False
    ) -> None:
        self._cell, self._rng = cell, rng
        bucket = min(b for b in costs.buckets if b >= cell.batch_size)
        sampled = cell.temperature > 0
        plain = costs.seconds[(PLAIN, bucket, sampled)]
        self.catch_up_excess = max(0.0, costs.catch_up.get((bucket, sampled), plain) - plain)
        self._slowdowns: list[float] = []
        self._calm: dict[DraftShape, list[float]] = {}
        if host_stalls:
            medians = {s: statistics.median(seconds) for s, seconds in cell.seconds.items()}
            self._slowdowns = _slowdowns(cell, medians)
            self._calm = {
                shape: [t for t in seconds if t <= _CALM * medians[shape]]
                for shape, seconds in cell.seconds.items()
            }
        self._at = rng.randrange(len(self._slowdowns)) if self._slowdowns else 0

    def __call__(self, shape: DraftShape, catch_up: bool = False) -> float:
        excess = self.catch_up_excess if catch_up else 0.0
        if not self._slowdowns:
            return self._rng.choice(self._cell.seconds[shape]) + excess
        self._at = (self._at + 1) % len(self._slowdowns)
        return (self._rng.choice(self._calm[shape]) + excess) * self._slowdowns[self._at]

    def mean(self, shape: DraftShape, catch_up: bool = False) -> float:
        measured = self._cell.seconds[shape]
        return sum(measured) / len(measured) + (self.catch_up_excess if catch_up else 0.0)


# a measured step over this many times its row's median ran while the host stalled
_CALM = 1.4


def _slowdowns(cell: Cell, medians: Mapping[DraftShape, float]) -> list[float]:
    """The cell's fixed rows one after the other, each step as its share of its row's median
    (``medians``) where it is a stall (over ``_CALM``), else 1: the host's slowdowns as the
    GPU met them."""
    timeline = []
    for shape, seconds in cell.seconds.items():
        median = medians[shape]
        timeline += [t / median if t > _CALM * median else 1.0 for t in seconds]
    return timeline
