"""Worker without speculation: prefill new requests, decode running ones, sample one token each."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.app.forward_batches import BatchBuilder, to_device
from eagletree.app.sampler import sample_next_tokens
from eagletree.app.workers.step import StepOutput

if TYPE_CHECKING:
    from eagletree.app.scheduler import SchedulePlan
    from eagletree.ports.model import ModelRunner


class NonSpeculativeWorker:
    """One EXTEND forward for the plan's new requests and one DECODE forward for the running."""

    def __init__(self, runner: ModelRunner) -> None:
        self._runner = runner
        self._batches = BatchBuilder(runner.req_to_token_pool)

    @property
    def reserve_per_step(self) -> int:
        return 1  # the pending token's slot

    def step(self, plan: SchedulePlan) -> StepOutput:
        logits: list[torch.Tensor] = []  # each (rows, V)
        if plan.prefill:
            batch, last_rows = self._batches.extend(plan.prefill)
            logits.append(self._runner.forward(batch, last_rows).logits)
        if plan.decode:
            logits.append(self._runner.forward(self._batches.decode(plan.decode)).logits)
        requests = plan.prefill + plan.decode
        tokens = sample_next_tokens(torch.cat(logits), requests)  # (bs,)
        committed = [r.num_tokens - r.committed_len for r in plan.prefill] + [1] * len(plan.decode)
        return StepOutput(
            requests=requests,
            tokens=tokens.unsqueeze(1),
            num_emitted=torch.ones_like(tokens),
            num_committed=to_device(torch.tensor(committed), tokens.device),
            num_forwards=len(logits),
            num_prefill=len(plan.prefill),
        )
