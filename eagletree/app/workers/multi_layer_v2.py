"""MultiLayerEagleWorkerV2: chain speculation with one DraftRunner per MTP layer, no host sync.

MTP layer i predicts the token ``i + 2`` places ahead (``mtp_chain``), so a chain of S drafts
needs no draft forward before verify: the draft-extend after each verify runs layer 0, 1, …,
S−1 over the same rows and the row of the bonus token yields draft i + 1 in layer i. Step i
always runs runner i, over runner i's own KV pool, req_to_token pool and attention backend
(a step that read the first runner's token pool would attend over another layer's slots).

Boundary rows: at the end of a draft-extend, layer i's last i rows read drafted tokens, not
true ones. Upstream keeps that KV. Here every draft-extend starts ``min(S − 1, L)`` rows before
the committed length L, recomputing those rows from tokens the target has since confirmed (the
target hidden states of the last S − 1 committed positions are kept per request for this,
``mtp_state``), so every layer's committed KV equals what that layer computes over the true
sequence.

One decode step: chain tree (root = bonus, node i = draft i) → TARGET_VERIFY (``TreeVerifier``)
→ draft-extend over ``S − 1 + N`` rows per request from ``L − S + 1`` (DRAFT_EXTEND, fixed width,
N = S + 1), which is one device function a CUDA graph can replay; a step in which a request has
fewer than S − 1 committed tokens extends ``min(S − 1, L) + N`` rows instead, sized on the host
(``mtp_extend``). No compaction: a chain's accepted path is already at the front of its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from eagletree.app.workers.decode_window import DecodeWindow
from eagletree.app.workers.draft_extender import shift_left
from eagletree.app.workers.mtp_chain import MtpLayerChain
from eagletree.app.workers.mtp_extend import fixed_extend_batch, ragged_extend_batch
from eagletree.app.workers.mtp_state import MtpStateStore
from eagletree.app.workers.speculative_worker import SpeculativeWorker
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.tree import TreeMaskMode

if TYPE_CHECKING:
    from eagletree.app.workers.decode_inputs import DecodeInputs
    from eagletree.app.workers.verifier import Verification
    from eagletree.domain.batch import ForwardBatch
    from eagletree.domain.model_output import ModelOutput
    from eagletree.domain.request import Request
    from eagletree.domain.tree import DraftTree
    from eagletree.domain.verify import VerifyResult
    from eagletree.ports.model import DraftRunner, ModelRunner


class MultiLayerEagleWorkerV2(SpeculativeWorker):
    """Speculative worker over S MTP layers (``drafts[i]`` runs draft step i), topk 1.

    Arguments as ``EagleWorkerV2``'s with one runner per MTP layer; ``num_draft_tokens`` must
    be ``num_steps + 1`` and ``drafts`` must hold at least ``num_steps`` runners. A runner may
    own a req_to_token pool of its own: the rows of a step's requests are copied into it from
    the target's (the scheduler's) before that runner runs.

    Per request the worker keeps, in an ``MtpStateStore`` indexed by req_to_token row, the
    pending bonus token, the S chain drafts with their draft probabilities, and the target
    hidden states of the last S − 1 committed positions with the tokens after them.
    """

    _state: MtpStateStore

    def __init__(
        self,
        target: ModelRunner,
        drafts: Sequence[DraftRunner],
        *,
        num_steps: int,
        topk: int = 1,
        num_draft_tokens: int,
        draft_hidden_size: int,
        use_aux_hidden: bool = False,
        mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
        kernels: StepKernels = REFERENCE_KERNELS,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
    ) -> None:
        hidden = target.hidden_size
        problems = []
        if topk != 1 or num_draft_tokens != num_steps + 1:
            problems.append(
                f"it drafts a chain: topk must be 1 and num_draft_tokens num_steps + 1 "
                f"(got topk={topk}, num_steps={num_steps}, num_draft_tokens={num_draft_tokens})"
            )
        if not 1 <= num_steps <= len(drafts):
            problems.append(f"num_steps={num_steps} needs 1..{len(drafts)} MTP layer runners")
        if use_aux_hidden or draft_hidden_size != hidden:
            problems.append(
                f"MTP layers read the target's final hidden states (width {hidden}); got "
                f"draft_hidden_size={draft_hidden_size}, use_aux_hidden={use_aux_hidden}"
            )
        if problems:
            raise ValueError("MultiLayerEagleWorkerV2: " + "; ".join(problems))
        self._chain = MtpLayerChain(
            drafts[:num_steps],
            target.req_to_token_pool,
            num_draft_tokens=num_draft_tokens,
            mask_mode=mask_mode,
            kernels=kernels,
        )
        self._state = MtpStateStore(
            target.req_to_token_pool.size,
            num_steps=num_steps,
            hidden_size=hidden,
            hidden_dtype=drafts[0].kv_pool.geometry.dtype,
            device=target.req_to_token_pool.req_to_token.device,
        )
        super().__init__(
            target,
            DraftShape(num_steps, 1, num_draft_tokens),
            mask_mode=mask_mode,
            kernels=kernels,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
        )

    def _prefill_draft(
        self,
        batch: ForwardBatch,
        last_rows: torch.Tensor,
        next_tokens: torch.Tensor,
        target_out: ModelOutput,
    ) -> int:
        tokens = shift_left(batch.input_ids, last_rows, next_tokens)
        hidden = target_out.hidden_states
        drafts, probs = self._chain.extend(batch, tokens, hidden, last_rows)
        self._state.keep(batch.req_pool_indices, tokens, hidden, drafts, probs, last_rows)
        return self.shape.num_steps

    def _runs_on_device(self, decode: Sequence[Request]) -> bool:
        # a lower bound of S − 1 committed tokens is enough for the fixed-width device step;
        # a shorter request takes the ragged step, which is sized from exact host lengths
        return all(r.committed_len >= self.shape.num_steps - 1 for r in decode)

    def _decode_as(self, shape: DraftShape, inputs: DecodeInputs) -> tuple[torch.Tensor, ...]:
        """Verify, then layer 0..S−1 over a fixed ``S − 1 + N`` rows per request (DRAFT_EXTEND
        from ``L − S + 1``; the S − 1 front rows' tokens are kept per row on the device) →
        tokens (bs, N) int64, emitted (bs,) int64. Device work only."""
        window = DecodeWindow.of(inputs)
        state = self._state.gather(inputs.rows)
        tree = self._chain.verify_tree(window, state)
        verification = self._verifier.verify(window, tree, inputs.sampling)
        predict = self._predict(verification.result, window.batch_size)
        batch, hidden, last_rows = fixed_extend_batch(
            window,
            self._state.front_tokens[inputs.rows],
            state,
            predict,
            verification,
            self._target.req_to_token_pool.req_to_token,
            num_steps=self.shape.num_steps,
            hidden_size=self._target.hidden_size,
        )
        accepted = self._extend_chain(window, tree, verification, batch, hidden, last_rows)
        return predict, accepted

    def _decode_on_host(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """The step when a request has fewer than S − 1 committed tokens (eager, host-sized)."""
        inputs = self._steps.buffers.fill(requests, len(requests), self._verifier.num_coins)
        window = DecodeWindow.of(inputs)
        state = self._state.gather(inputs.rows)
        tree = self._chain.verify_tree(window, state)
        verification = self._verifier.verify(window, tree, inputs.sampling)
        batch, hidden, last_rows = ragged_extend_batch(
            requests,
            window,
            state,
            verification,
            self._target.req_to_token_pool.req_to_token,
            num_steps=self.shape.num_steps,
            num_draft_tokens=self.shape.num_draft_tokens,
            hidden_size=self._target.hidden_size,
        )
        accepted = self._extend_chain(window, tree, verification, batch, hidden, last_rows)
        return self._predict(verification.result, window.batch_size), accepted

    def _extend_chain(
        self,
        window: DecodeWindow,
        tree: DraftTree,
        verification: Verification,
        batch: ForwardBatch,
        hidden: torch.Tensor,
        last_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Run the layer chain over a verify's draft-extend and keep the next state; returns
        the tokens each request committed (bs,) int64. Device work only."""
        rows = window.req_pool_indices
        drafts, probs = self._chain.extend(batch, batch.input_ids, hidden, last_rows)
        self._state.keep(rows, batch.input_ids, hidden, drafts, probs, last_rows)
        accepted = verification.result.accept_length.to(torch.int64) + 1  # (bs,) committed
        self._steps.buffers.advance_lengths(rows, window.seq_lens + accepted)
        self.last_tree, self.last_verification = tree, verification
        return accepted

    def _predict(self, result: VerifyResult, batch_size: int) -> torch.Tensor:
        # (bs·N,) int32 → (bs, N) int64: each node's predicted token, the step's output rows
        return result.predict.to(torch.int64).view(batch_size, self.shape.num_draft_tokens)
