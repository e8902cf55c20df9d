"""Worker without speculation: prefill new requests, decode running ones, sample one token each.

The decode forward and its sampling are one function of the step's ``DecodeInputs``, so a
``DecodeStepRunner`` can replay it from a CUDA graph per batch-size bucket.

With ``run_ahead`` a decode step can be launched while the previous step is in flight (the
engine's overlap mode): each request's pending token is then unknown to the host, so the worker
keeps it on the device, indexed by req_to_token row — the prefill and every decode step (inside
the captured function, so a replay writes it too) store the token they sampled, and the next
step gathers its input tokens from there. Lengths need no device table: every decode step
commits exactly one token per request, so a request the step in flight decodes is one token
longer than the host's ``committed_len``, and the host's lengths stay exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.transfers import to_device
from eagletree.app.engine.worker import StepOutput, joined_phases
from eagletree.app.workers.sampler import sample_next_tokens, sample_tokens
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.app.workers.step_worker import StepWorker
from eagletree.domain.batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.app.workers.decode_inputs import DecodeInputs
    from eagletree.domain.request import Request
    from eagletree.ports.model import ModelRunner


class NonSpeculativeWorker(StepWorker):
    """One EXTEND forward for the plan's new requests and one DECODE forward for the running.

    ``kernels``, ``graph_buckets`` and ``use_cuda_graphs`` as ``StepWorker``'s.
    ``run_ahead``: keep the pending tokens on the device (one gather and one scatter a step)
    so that ``can_run_ahead`` holds; a step launched ahead writes one slot past the host's
    committed length, so each request keeps two slots reserved instead of one.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        kernels: StepKernels = REFERENCE_KERNELS,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
        run_ahead: bool = False,
    ) -> None:
        self._runner = runner
        self._run_ahead = run_ahead
        super().__init__(
            runner.req_to_token_pool,
            kernels=kernels,
            num_coins=1,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
            device_tokens=run_ahead,
        )
        # rows the latest step decoded: the step in flight when a plan's lengths are not exact
        self._rows_in_flight: frozenset[int | None] = frozenset()

    @property
    def reserve_per_step(self) -> int:
        # the pending token's slot, and with run_ahead the slot of the step launched ahead
        return 2 if self._run_ahead else 1

    def can_run_ahead(self, decode: Sequence[Request]) -> bool:
        # without run_ahead the pending tokens come from the host, which has not read them yet
        return self._run_ahead

    def step(self, plan: SchedulePlan) -> StepOutput:
        assert plan.exact_lengths or self._run_ahead, "launched ahead without run_ahead"
        ahead = frozenset() if plan.exact_lengths else self._rows_in_flight
        self._rows_in_flight = frozenset(r.row for r in plan.decode)
        phases = plan.phases  # the group's, when it shares the dense layers: maybe zero rows
        if not phases.prefill:  # the common step: everything from the decode function (or graph)
            tokens, ones = self._decode(plan.decode, ahead)
            return StepOutput(plan.decode, tokens, ones, ones, num_forwards=1, num_prefill=0)
        batch, last_rows = self._batches.extend(plan.prefill)
        logits = self._runner.forward(batch, last_rows).logits
        first = sample_next_tokens(logits, plan.prefill, self._kernels)  # (bs,)
        if self._run_ahead:
            self._steps.buffers.set_pending_tokens(batch.req_pool_indices, first.to(torch.int64))
        committed = [r.num_tokens - r.committed_len for r in plan.prefill]
        prefilled = StepOutput(
            requests=plan.prefill,
            tokens=first.unsqueeze(1),
            num_emitted=torch.ones_like(first),
            num_committed=to_device(torch.tensor(committed), first.device),
            num_forwards=1,
            num_prefill=len(plan.prefill),
        )
        if not phases.decode:
            return prefilled
        tokens, ones = self._decode(plan.decode, ahead)
        decoded = StepOutput(plan.decode, tokens, ones, ones, num_forwards=1, num_prefill=0)
        return joined_phases([prefilled, decoded], len(plan.prefill), speculative=False)

    def _decode(
        self, requests: list[Request], ahead: frozenset[int | None]
    ) -> tuple[torch.Tensor, ...]:
        """The decode step over ``requests`` at exact lengths: those the step in flight decodes
        (rows ``ahead``) have committed one token more than the host knows (a prefill's fill
        is committed on the host when it is launched)."""
        lengths = [r.committed_len + int(r.row in ahead) for r in requests] if ahead else None
        return self._steps.run(requests, lengths=lengths)

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
        tokens = sample_tokens(logits, inputs.sampling, self._kernels).to(torch.int64)
        if self._run_ahead:  # the next step's input, whether or not the host has read it
            self._steps.buffers.set_pending_tokens(inputs.rows, tokens)
        return tokens.unsqueeze(1), torch.ones_like(tokens)
