"""EagleWorkerV2: EAGLE tree speculation with compaction, fixed shapes and no host sync in a step.

One decode step (docs/speculative.md has the diagram):

1. draft    — S − 1 DRAFT_DECODE forwards over a k-wide beam per request (``TreeDrafter``);
2. tree     — the N − 1 best candidates under the bonus token as root (``build_tree``);
3. verify   — one TARGET_VERIFY forward over the N nodes at window slots [L, L + N), then
              greedy or sampled acceptance (``TreeVerifier``);
4. compact  — k > 1 only: the accepted path's target KV moved to slots [L, L + a], predict and
              the target hidden states gathered to rows [0, a] of each N-row block;
5. extend   — one DRAFT_EXTEND forward of fixed width N per request; row a proposes the next
              top-k (``DraftExtender``);
6. output   — tokens = compacted predict rows [0, a], a + 1 of them, and as many committed.

Nothing is allocated or freed here: the scheduler keeps ``2·max(S·k, N)`` slots backed past
each request's committed length. Per-request device state (bonus token, top-k, draft hidden)
lives in a ``DraftStateStore`` indexed by req_to_token row. Phases 1–6 are one function of the
step's ``DecodeInputs`` (``_decode_on_device``), so a ``DecodeStepRunner`` can replay them from a
CUDA graph per batch-size bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.worker import StepOutput
from eagletree.app.workers.decode_inputs import DecodeInputBuffers, DecodeInputs
from eagletree.app.workers.draft_state import DecodeWindow
from eagletree.app.workers.step import speculative_step
from eagletree.app.workers.step_graphs import DecodeStepRunner
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.app.workers.tree_parts import build_tree_parts, prefill_tree_requests
from eagletree.app.workers.verifier import Verification
from eagletree.domain.compaction import compact_rows
from eagletree.domain.tree import DraftTree, TreeMaskMode

if TYPE_CHECKING:
    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.domain.request import Request
    from eagletree.ports.model import DraftRunner, ModelRunner


class EagleWorkerV2:
    """Speculative worker: prefill + draft prefill for new requests, a tree step for the rest.

    ``draft_hidden_size`` is the width of the draft's own hidden state (what it feeds its next
    draft step); ``use_aux_hidden`` makes the draft read the target's aux hidden states
    (EAGLE-3). ``kernels`` are the fused device functions of a step (``StepKernels``).
    ``graph_buckets``: batch sizes whose decode step runs padded to a fixed shape (and, with
    ``use_cuda_graphs``, from a captured CUDA graph; ``capture_graphs`` records them); this
    takes one req_to_token row for padding. ``last_tree`` / ``last_verification`` keep the
    latest decode step's device results for inspection (tests, debugging; a verification's
    predict and hidden states are compacted in place, see ``Verification``); nothing reads
    them back on the host.
    """

    def __init__(
        self,
        target: ModelRunner,
        draft: DraftRunner,
        *,
        num_steps: int,
        topk: int,
        num_draft_tokens: int,
        draft_hidden_size: int,
        use_aux_hidden: bool = False,
        mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
        kernels: StepKernels = REFERENCE_KERNELS,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
    ) -> None:
        self._target = target
        self.num_steps = num_steps
        self.topk = topk
        self.num_draft_tokens = num_draft_tokens
        self._parts = build_tree_parts(
            target,
            draft,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            mask_mode=mask_mode,
            kernels=kernels,
        )
        self._steps = DecodeStepRunner(
            self._decode_on_device,
            DecodeInputBuffers.for_pool(
                target.req_to_token_pool, padded=bool(graph_buckets), device_lengths=True
            ),
            num_coins=self._parts.verifier.num_coins,
            buckets=graph_buckets,
            use_graphs=use_cuda_graphs,
        )
        self.mask_mode = mask_mode
        self.last_tree: DraftTree | None = None
        self.last_verification: Verification | None = None

    @property
    def reserve_per_step(self) -> int:
        # one step writes max(S·k, N) window slots; twice that lets the host learn lengths late
        return 2 * max(self.num_steps * self.topk, self.num_draft_tokens)

    @property
    def tokens_per_step(self) -> int:
        """Most tokens one verify step emits: S accepted drafts and the bonus, within N."""
        return min(self.num_steps + 1, self.num_draft_tokens)

    def can_run_ahead(self, decode: Sequence[Request]) -> bool:
        # committed lengths live on the device; only FULL_MASK sizes its mask from Σ L_b
        return self.mask_mode is TreeMaskMode.QLEN_ONLY

    @property
    def num_tracked_requests(self) -> int:
        """Requests whose draft state the worker holds (the live ones after a step)."""
        return len(self._parts.state)

    @property
    def step_runner(self) -> DecodeStepRunner:
        return self._steps

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float:
        """Capture the decode step's CUDA graph of every bucket; returns the seconds taken."""
        return self._steps.capture(progress)

    def step(self, plan: SchedulePlan) -> StepOutput:
        """Prefill the plan's new requests, run one tree step over its running ones.

        A plan without requests runs an idle tree step (bs == 0) through every phase, as a
        data-parallel rank without requests must.
        """
        self._parts.state.retain(plan.live)
        exact = plan.exact_lengths
        return speculative_step(
            plan, self._prefill, lambda requests: self._decode(requests, exact_lengths=exact)
        )

    def _prefill(self, requests: list[Request]) -> StepOutput:
        self._steps.buffers.set_lengths(requests)
        return prefill_tree_requests(self._parts, self._target, requests, self.tokens_per_step)

    def _decode(self, requests: list[Request], *, exact_lengths: bool = True) -> StepOutput:
        self._parts.state.check_owned(requests)
        tokens, emitted = self._steps.run(requests, exact_lengths=exact_lengths)
        self._parts.state.own(requests)
        return StepOutput(
            requests=requests,
            tokens=tokens,
            num_emitted=emitted,
            num_committed=emitted,
            num_forwards=self._parts.drafter.num_forwards + 2,
            num_prefill=0,
        )

    def _decode_on_device(self, inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Phases 1–6 over ``inputs`` → tokens (bs, S + 1) int64 (the first ``emitted`` of each
        row are the step's tokens), emitted (bs,) int64. Device work only."""
        parts, n = self._parts, self.num_draft_tokens
        window = DecodeWindow(
            inputs.rows, inputs.seq_lens, inputs.seq_lens_cpu, inputs.seq_lens_sum
        )
        tree = parts.drafter.draft(window, parts.state.gather_rows(inputs.rows))
        verification = parts.verifier.verify(window, tree, inputs.sampling)
        result = verification.result
        predict = result.predict  # (bs·N,) int32
        features = parts.extender.target_features(
            verification.hidden_states, verification.aux_hidden_states
        )
        if self.topk > 1:  # a chain's accepted path is already at the front of its block
            plan = parts.kernels.compaction_plan(
                result.accept_index, result.accept_length, verification.verify_slots, n
            )
            # pairs overlap only within a request's S+1 pairs: each group moves independently
            groups = result.accept_index.shape[1]
            self._target.kv_pool.move_kv_cache(plan.tgt, plan.src, independent_groups=groups)
            predict = compact_rows(predict, plan)
            features = compact_rows(features, plan)
        next_state = parts.extender.extend_block(
            window, predict, features, result.accept_length, verification.verify_slots, n
        )
        parts.state.scatter_rows(inputs.rows, next_state)
        accepted = result.accept_length.to(torch.int64) + 1  # (bs,) tokens committed
        self._steps.buffers.advance_lengths(inputs.rows, inputs.seq_lens + accepted)
        self.last_tree, self.last_verification = tree, verification
        bs = window.batch_size
        tokens = predict.view(bs, n)[:, : self.tokens_per_step].to(torch.int64)
        return tokens, accepted
