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
each request's committed length. Phases 1–6 are one function of the step's ``DecodeInputs``
(``_decode_as``), so a ``DecodeStepRunner`` can replay them from a CUDA graph per
batch-size bucket; the prefill and the step around them are ``SpeculativeWorker``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.app.workers.decode_window import DecodeWindow
from eagletree.app.workers.sampler import sample_tokens
from eagletree.app.workers.tree_worker import TreeWorker
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.compaction import compact_rows

if TYPE_CHECKING:
    from eagletree.app.workers.decode_inputs import DecodeInputs
    from eagletree.app.workers.draft_state import DraftInput
    from eagletree.domain.draft_shape import DraftShape


class EagleWorkerV2(TreeWorker):
    """Speculative worker: prefill + draft prefill for new requests, a tree step for the rest
    (arguments as ``TreeWorker``'s). A step of the plain shape (S = 0) decodes one token with
    the target and leaves the token in the draft's lag, which a later plain step's catch-up
    extends the draft over (``DraftLag``)."""

    def _decode_as(self, shape: DraftShape, inputs: DecodeInputs) -> tuple[torch.Tensor, ...]:
        """Phases 1–6 of ``shape`` over ``inputs`` → tokens (bs, S + 1) int64 (the first
        ``emitted`` of each row are the step's tokens), emitted (bs,) int64 and, when the
        policy observes and the shape is a tree, the accepted paths' ranks and offers (bs, 2·S)
        int64. Device work only."""
        if shape.is_plain:
            return self._decode_plain(inputs)
        n = shape.num_draft_tokens
        window = DecodeWindow.of(inputs)
        tree, verification = self._draft_and_verify(shape, window, inputs.rows, inputs.sampling)
        result = verification.result
        predict = result.predict  # (bs·N,) int32
        features = self._extender.target_features(
            verification.hidden_states, verification.aux_hidden_states
        )
        if shape.topk > 1:  # a chain's accepted path is already at the front of its block
            plan = self._kernels.compaction_plan(
                result.accept_index, result.accept_length, verification.verify_slots, n
            )
            # pairs overlap only within a request's S+1 pairs: each group moves independently
            groups = result.accept_index.shape[1]
            self._target.kv_pool.move_kv_cache(plan.tgt, plan.src, independent_groups=groups)
            predict = compact_rows(predict, plan)
            features = compact_rows(features, plan)
        next_state = self._extender.extend_block(
            window, predict, features, result.accept_length, verification.verify_slots, n
        )
        self._state.scatter(inputs.rows, next_state)
        accepted = result.accept_length.to(torch.int64) + 1  # (bs,) tokens committed
        self._steps.buffers.advance_lengths(inputs.rows, inputs.seq_lens + accepted)
        self.last_tree, self.last_verification = tree, verification
        bs = window.batch_size
        tokens = predict.view(bs, n)[:, : shape.tokens_per_step].to(torch.int64)
        if not self.policy.observes or shape.topk == 1:  # a chain's path: emitted alone
            return tokens, accepted
        observed = self._kernels.path_ranks(tree.parents, result.accept_index, result.accept_length)
        return tokens, accepted, observed  # observed: (bs, 2·S) int64

    def _decode_catching_up(self, inputs: DecodeInputs) -> tuple[torch.Tensor, ...]:
        return self._decode_plain(inputs, catch_up=True)

    def _decode_plain(
        self, inputs: DecodeInputs, catch_up: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """One target DECODE of every pending token, sampled; the new token and its target
        feature join the row's draft lag, and with ``catch_up`` the draft extends over the
        whole lag (its KV, hidden state and top-k, for the steps that draft again) → tokens
        (bs, 1), emitted (bs,) ones (and no observed columns). Device work only."""
        window = DecodeWindow.of(inputs)
        bs = window.batch_size
        pending = self._state.bonus_tokens[inputs.rows]  # (bs,) int64
        slots = window.slots(self._target.req_to_token_pool.req_to_token, 1).reshape(bs)
        batch = ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=pending,
            positions=window.seq_lens,
            seq_lens=window.seq_lens,
            req_pool_indices=window.req_pool_indices,
            out_cache_loc=slots,
            seq_lens_cpu=window.seq_lens_cpu,
            seq_lens_sum=window.seq_lens_sum,
        )
        out = self._target.forward(batch)  # logits (bs, V)
        tokens = sample_tokens(out.logits, inputs.sampling, self._kernels).to(torch.int64)
        features = self._extender.target_features(out.hidden_states, out.aux_hidden_states)
        lag = self._state.lag
        committed = self._steps.buffers.committed
        assert committed is not None, "a speculative step keeps its lengths on the device"
        # the pair joins the lag, the length grows by one and, unless the catch-up proposes
        # the next pending token, the token is pending: one launch where the kernels are fused
        self._kernels.plain_step_writes(
            inputs.rows,
            tokens,
            features,
            window.seq_lens,
            lag.tokens,
            lag.features_for(features),
            lag.count,
            committed,
            None if catch_up else self._state.bonus_tokens,
        )
        if catch_up:
            self._state.scatter(inputs.rows, self._extend_over_lag(window, inputs.rows))
            lag.clear(inputs.rows)
        accepted = torch.ones_like(tokens)
        if not self.policy.observes:
            return tokens.unsqueeze(1), accepted
        return tokens.unsqueeze(1), accepted, tokens.new_zeros(bs, 0)

    def _extend_over_lag(self, window: DecodeWindow, rows: torch.Tensor) -> DraftInput:
        """The draft's extend over each row's lag, whose newest pair read the pending token:
        the lag's c pairs are positions L + 1 − c .. L (L the step's committed length, the
        pending token's position), one block of the lag's width from L + 1 − c."""
        width = self._state.lag.width
        tokens, features, counts = self._state.lag.read(rows)
        if width > 1:  # the block starts behind the host's lengths: a device-only window
            start = (window.seq_lens + 1 - counts).clamp_min(0)  # padding rows: from 0
            window = DecodeWindow(window.req_pool_indices, start)
        slots = window.slots(self._target.req_to_token_pool.req_to_token, width)
        return self._extender.extend_block(
            window, tokens, features, counts - 1, slots.reshape(-1), width
        )
