"""Worker without speculation: prefill new requests, decode running ones, sample one token each.

The decode forward and its sampling are one function of the step's ``DecodeInputs``, so a
``DecodeStepRunner`` can replay it from a CUDA graph per batch-size bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from eagletree.app.forward_batches import BatchBuilder, to_device
from eagletree.app.sampler import sample_next_tokens, sample_tokens
from eagletree.app.workers.decode_inputs import DecodeInputBuffers, DecodeInputs
from eagletree.app.workers.step import StepOutput
from eagletree.app.workers.step_graphs import DecodeStepRunner
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.domain.batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from eagletree.app.scheduler import SchedulePlan
    from eagletree.domain.request import Request
    from eagletree.ports.model import ModelRunner


class NonSpeculativeWorker:
    """One EXTEND forward for the plan's new requests and one DECODE forward for the running.

    ``kernels``, ``graph_buckets`` and ``use_cuda_graphs`` as ``EagleWorkerV2``'s.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        kernels: StepKernels = REFERENCE_KERNELS,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
    ) -> None:
        self._runner = runner
        self._batches = BatchBuilder(runner.req_to_token_pool)
        self._kernels = kernels
        self._steps = DecodeStepRunner(
            self._decode_on_device,
            DecodeInputBuffers.for_pool(runner.req_to_token_pool, padded=bool(graph_buckets)),
            num_coins=1,
            buckets=graph_buckets,
            use_graphs=use_cuda_graphs,
        )

    @property
    def reserve_per_step(self) -> int:
        return 1  # the pending token's slot

    def can_run_ahead(self, decode: Sequence[Request]) -> bool:
        return False  # its decode inputs (lengths, pending tokens) come from the host

    @property
    def step_runner(self) -> DecodeStepRunner:
        return self._steps

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float:
        """Capture the decode step's CUDA graph of every bucket; returns the seconds taken."""
        return self._steps.capture(progress)

    def step(self, plan: SchedulePlan) -> StepOutput:
        if not plan.prefill:  # the common step: everything from the decode function (or graph)
            tokens, ones = self._steps.run(plan.decode)
            return StepOutput(plan.decode, tokens, ones, ones, num_forwards=1, num_prefill=0)
        batch, last_rows = self._batches.extend(plan.prefill)
        logits = self._runner.forward(batch, last_rows).logits
        first = sample_next_tokens(logits, plan.prefill, self._kernels.coins)  # (bs,)
        committed = [r.num_tokens - r.committed_len for r in plan.prefill]
        tokens, emitted = first.unsqueeze(1), torch.ones_like(first)
        num_committed = to_device(torch.tensor(committed), first.device)
        if plan.decode:
            decode_tokens, ones = self._steps.run(plan.decode)
            tokens = torch.cat([tokens, decode_tokens])
            emitted = torch.cat([emitted, ones])
            num_committed = torch.cat([num_committed, ones])
        return StepOutput(
            requests=plan.prefill + plan.decode,
            tokens=tokens,
            num_emitted=emitted,
            num_committed=num_committed,
            num_forwards=1 + bool(plan.decode),
            num_prefill=len(plan.prefill),
        )

    def _decode_on_device(self, inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """One DECODE forward of every row's pending token at its committed length, sampled →
        (next tokens (bs, 1) int64, ones (bs,) int64: emitted and committed). Device work
        only."""
        table = self._runner.req_to_token_pool.req_to_token
        batch = ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=inputs.last_tokens,
            positions=inputs.seq_lens,
            seq_lens=inputs.seq_lens,
            req_pool_indices=inputs.rows,
            out_cache_loc=table[inputs.rows, inputs.seq_lens].to(torch.int64),
            seq_lens_cpu=inputs.seq_lens_cpu,
            seq_lens_sum=inputs.seq_lens_sum,
        )
        logits = self._runner.forward(batch).logits  # (bs, V)
        tokens = sample_tokens(logits, inputs.sampling, self._kernels.coins).to(torch.int64)
        return tokens.unsqueeze(1), torch.ones_like(tokens)
