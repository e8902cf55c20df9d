"""Domain: tokens emitted per speculative verify step, as a histogram (``AcceptanceStats``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class AcceptanceStats:
    """Tokens emitted per speculative verify step: histogram[i] = steps that emitted i tokens."""

    num_steps: int
    num_emitted: int
    histogram: tuple[int, ...] = field(default=())

    @property
    def mean_accept_length(self) -> float:
        return self.num_emitted / self.num_steps if self.num_steps else 0.0

    @staticmethod
    def from_counts(emitted_per_step: Sequence[int]) -> AcceptanceStats:
        histogram = [0] * (max(emitted_per_step, default=-1) + 1)
        for emitted in emitted_per_step:
            histogram[emitted] += 1
        return AcceptanceStats(len(emitted_per_step), sum(emitted_per_step), tuple(histogram))
