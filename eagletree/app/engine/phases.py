"""App: the phases of a step agreed over a data-parallel group whose dense layers are shared.

When the MLP, embedding and lm_head are sharded over the data-parallel ranks, each of their
forwards is a collective of the whole group, so every rank must run the same forwards in the
same order — not only the same number of steps. After scheduling and before the launch, the
engine reduces each rank's phases (prefill? decode?) over the group: a rank runs every phase
any rank runs, a phase it has no request for with zero rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from eagletree.app.engine.plan import StepPhases

if TYPE_CHECKING:
    from eagletree.app.engine.plan import SchedulePlan


class PhaseAgreement:
    """The group's phases of a step, over the data-parallel host (gloo) ``group``."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self._group = group

    def agree(self, plan: SchedulePlan) -> StepPhases:
        """The phases any rank of the group has in its plan this step (every rank calls it)."""
        flags = torch.tensor([bool(plan.prefill), bool(plan.decode)], dtype=torch.int64)
        if self._group is not None:
            # SYNC: a host exchange with every rank once a step (gloo, no device wait): the
            # shared dense layers need the same forwards on every rank
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
        prefill, decode = (bool(flag) for flag in flags.tolist())
        return StepPhases(prefill, decode)
