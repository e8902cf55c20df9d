"""App: what one scheduler iteration hands the worker — its requests by role and the phases it runs.

``Scheduler.schedule`` builds a ``SchedulePlan``; the engine may mark it as run ahead of the
step in flight (``exact_lengths``) or give it the phases its data-parallel group agreed on
(``group_phases``) before the worker runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from eagletree.domain.request import Request


class StepPhases(NamedTuple):
    """Which phases a step runs: a prefill of new requests, a decode (or verify) of running
    ones. A step with neither runs an idle decode."""

    prefill: bool
    decode: bool


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    """What one iteration runs, in the order the scheduler decided it."""

    prefill: list[Request]  # admitted now: row [0, num_tokens) backed, committed_len == 0
    decode: list[Request]  # prefilled and running: allocated >= committed + reserve_per_step
    retracted: list[Request]  # back in the queue with their tokens; device state is stale
    released: list[Request]  # finished or aborted since the last iteration, now FINISHED
    # False while the previous step is in flight: the decode requests' committed_len is then a
    # lower bound (by at most one step's tokens, which the window reserve covers)
    exact_lengths: bool = True
    # running but not decoded this step, because its prefills run alone: their windows, rows
    # and worker state stay as they are
    paused: list[Request] = field(default_factory=list)
    # the phases the whole data-parallel group runs when it shares its dense layers (None: this
    # plan's own): a phase this plan has no request for runs with zero rows
    group_phases: StepPhases | None = None

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.decode)

    @property
    def phases(self) -> StepPhases:
        """The phases the worker runs: the group's, or this plan's own."""
        if self.group_phases is not None:
            return self.group_phases
        return StepPhases(bool(self.prefill), bool(self.decode))

    @property
    def live(self) -> list[Request]:
        """Every running request, admitted now or before: those whose worker state is kept."""
        return self.prefill + self.decode + self.paused
