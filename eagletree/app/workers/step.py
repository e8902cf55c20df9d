"""The steps every speculative worker shares: a prefill's output, and a plan's two phases joined."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from eagletree.app.engine.host_copy import to_device
from eagletree.app.engine.worker import StepOutput

if TYPE_CHECKING:
    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.domain.request import Request


def prefill_output(
    requests: list[Request], next_tokens: torch.Tensor, tokens_per_step: int, num_forwards: int
) -> StepOutput:
    """What a speculative worker's prefill of ``requests`` produced: each request's first token
    ``next_tokens`` (bs,) int64, padded to ``tokens_per_step`` columns, one emitted and the
    whole fill committed."""
    committed = torch.tensor([r.num_tokens - r.committed_len for r in requests])
    return StepOutput(
        requests=requests,
        tokens=F.pad(next_tokens.unsqueeze(1), (0, tokens_per_step - 1)),
        num_emitted=torch.ones_like(next_tokens),
        num_committed=to_device(committed, next_tokens.device),
        num_forwards=num_forwards,
        num_prefill=len(requests),
    )


def speculative_step(
    plan: SchedulePlan,
    prefill: Callable[[list[Request]], StepOutput],
    decode: Callable[[list[Request]], StepOutput],
) -> StepOutput:
    """Prefill the plan's new requests, then one verify step over its running ones; the rows of
    the two phases joined in that order. A plan with neither runs an idle verify step (bs == 0)
    through every phase, as a data-parallel rank without requests must; a group sharing its
    dense layers runs the phases it agreed on (``plan.phases``), some maybe with zero rows."""
    parts: list[StepOutput] = []
    phases = plan.phases
    if phases.prefill:
        parts.append(prefill(plan.prefill))
    if phases.decode or not phases.prefill:
        parts.append(decode(plan.decode))
    if len(parts) == 1:  # one phase: its tensors as they are (no joining kernels)
        return dataclasses.replace(parts[0], num_prefill=len(plan.prefill), speculative=True)
    return StepOutput(
        requests=[r for part in parts for r in part.requests],
        tokens=torch.cat([part.tokens for part in parts]),
        num_emitted=torch.cat([part.num_emitted for part in parts]),
        num_committed=torch.cat([part.num_committed for part in parts]),
        num_forwards=sum(part.num_forwards for part in parts),
        num_prefill=len(plan.prefill),
        speculative=True,
    )
