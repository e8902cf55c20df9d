"""The measured time of one decode step per draft shape, batch-size bucket and sampling.

An adaptive worker prices each candidate shape by what its step costs on this machine and this
model: at start, after its graphs are captured, every shape's step is replayed over padding
rows at every bucket, greedy and sampled (``measure_step_costs``). A step's cost depends on the
machine and the model, not on the requests, so the table is measured once.
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

    def of(self, shape: DraftShape, batch_size: int, sampled: bool) -> float:
        """The step time of ``batch_size`` requests: its bucket's, or above the largest bucket
        the largest's scaled by the rows (an eager step past the graphs is at least that)."""
        bucket = bucket_for(batch_size, self.buckets)
        if bucket is None:
            largest = self.buckets[-1]
            return self.seconds[(shape, largest, sampled)] * batch_size / largest
        return self.seconds[(shape, bucket, sampled)]

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
