"""Application: how a measurement steps its engine — alone, or in lockstep with the other
data-parallel replicas of a group.

A replica measures only the requests placed on it, but the group's figures need one window:
every decision to step again (prefilled yet? enough tokens? a request finished early?) is
taken over the whole group, by one small all-reduce of host values over the data-parallel
gloo group, so every replica makes the same number of steps; a replica without requests runs
idle steps meanwhile. ``ALONE`` (no group) reduces nothing and steps as a lone engine does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from eagletree.app.engine.loop import Engine


class Lockstep:
    """The data-parallel ``group`` (of ``size`` replicas, this one ``replica``) a measurement
    steps with; None: alone."""

    def __init__(
        self, group: dist.ProcessGroup | None = None, size: int = 1, replica: int = 0
    ) -> None:
        self._group = group
        self.size = size
        self.replica = replica

    @property
    def grouped(self) -> bool:
        return self._group is not None

    def step(self, engine: Engine) -> None:
        """One step of ``engine``; in a group also without requests (an idle step)."""
        if self.grouped:
            engine.step(run_idle=True)
        else:
            engine.step()

    def minimum(self, values: Sequence[float]) -> list[float]:
        """Each value's least over the group."""
        return self._reduce(values, dist.ReduceOp.MIN)

    def total(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the group."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def per_replica(self, value: int) -> list[int]:
        """Every replica's ``value``, by replica."""
        mine = [value if replica == self.replica else 0 for replica in range(self.size)]
        return [int(each) for each in self.total(mine)]

    def first_problem(self, problem: str | None) -> str:
        """The first replica's problem (when one replica or more has one), naming the replica."""
        if self._group is None:
            assert problem is not None
            return problem
        problems: list[str | None] = [None] * self.size
        dist.all_gather_object(problems, problem, group=self._group)
        replica, first = next((r, p) for r, p in enumerate(problems) if p is not None)
        return f"replica {replica}: {first}"

    def _reduce(self, values: Sequence[float], op: dist.ReduceOp.RedOpType) -> list[float]:
        if self._group is None:
            return [float(value) for value in values]
        reduced = torch.tensor(values, dtype=torch.float64)
        # SYNC: a host exchange with every replica, once a step: the lockstep itself
        dist.all_reduce(reduced, op=op, group=self._group)
        return [float(value) for value in reduced.tolist()]


ALONE = Lockstep()
