"""Draft-extend: the draft catches up with the target's committed tokens and proposes the next.

Draft convention: the draft row at position p reads the token at p + 1 together with the
target's hidden state at p (EAGLE-3: the target's captured aux states), and its KV is the draft
KV of position p. So a prefill's draft extend shifts the prompt left by one and appends the
token the target just sampled; after a verify the draft re-extends the compacted block, whose
row j holds node j's predicted token (the token at L + j + 1) and node j's target hidden state.
The row that read the newest token (the bonus) gives the next top-k and draft hidden state.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from eagletree.app.workers.draft_state import DraftInput
from eagletree.domain.batch import DraftExtendSpec, ForwardBatch, ForwardMode
from eagletree.domain.sampling import top_k_probs

if TYPE_CHECKING:
    from eagletree.app.workers.decode_window import DecodeWindow
    from eagletree.app.workers.step_kernels import TopK
    from eagletree.domain.model_output import ModelOutput
    from eagletree.ports.model import DraftRunner


def shift_left(
    input_ids: torch.Tensor, last_rows: torch.Tensor, next_tokens: torch.Tensor
) -> torch.Tensor:
    """Each request's tokens moved one place left, its last row replaced by ``next_tokens``.

    ``input_ids`` (num_tokens,) request-major; ``last_rows`` (bs,) each request's last row;
    ``next_tokens`` (bs,) the token that follows each request's last input token.
    """
    shifted = torch.roll(input_ids, -1) if input_ids.numel() else input_ids.clone()
    return shifted.index_copy(0, last_rows, next_tokens.to(input_ids.dtype))


class DraftExtender:
    """Runs ``draft`` over committed tokens; ``use_aux_hidden`` feeds it the target's aux hidden
    states (EAGLE-3) instead of the final-normed ones; ``keep_logits``: the next state carries
    the draft's logits after the bonus (a step that draws its drafts draws the root's children
    from them). Free of host synchronisation."""

    def __init__(
        self,
        draft: DraftRunner,
        *,
        topk: int,
        use_aux_hidden: bool,
        top_k: TopK = top_k_probs,
        keep_logits: bool = False,
    ) -> None:
        self._draft = draft
        self._top_k = top_k
        self.topk = topk
        self.use_aux_hidden = use_aux_hidden
        self.keep_logits = keep_logits  # the next state carries the root's logits

    def target_features(
        self, hidden_states: torch.Tensor, aux_hidden_states: torch.Tensor | None
    ) -> torch.Tensor:
        """The target hidden states this draft reads: (num_tokens, H) or (num_tokens, n·H)."""
        if not self.use_aux_hidden:
            return hidden_states
        if aux_hidden_states is None:
            raise RuntimeError(
                "the draft reads the target's aux hidden states (EAGLE-3) but the target does "
                "not capture them: load the target with the draft's aux layer ids"
            )
        return aux_hidden_states

    def extend_prefill(
        self,
        target_batch: ForwardBatch,
        last_rows: torch.Tensor,
        next_tokens: torch.Tensor,
        target_out: ModelOutput,
    ) -> DraftInput:
        """Draft prefill over the same tokens, slots and positions as the target's EXTEND.

        ``last_rows`` (bs,) each request's last token row; ``next_tokens`` (bs,) what the
        target sampled after it (the new bonus tokens).
        """
        batch = dataclasses.replace(
            target_batch, input_ids=shift_left(target_batch.input_ids, last_rows, next_tokens)
        )
        features = self.target_features(target_out.hidden_states, target_out.aux_hidden_states)
        return self.extend_ragged(batch, features, last_rows)

    def extend_ragged(
        self, batch: ForwardBatch, hidden_states: torch.Tensor, last_rows: torch.Tensor
    ) -> DraftInput:
        """An EXTEND of the draft whose ``input_ids`` already follow the draft convention; the
        next state comes from each request's last row (its input token is the bonus)."""
        out = self._draft.forward(batch, hidden_states, last_rows)
        topk_p, topk_index = self._top_k(out.logits, self.topk, out.token_ids)  # target ids
        return DraftInput(
            bonus_tokens=batch.input_ids.index_select(0, last_rows).to(torch.int64),
            topk_p=topk_p,
            topk_index=topk_index,
            hidden_states=out.hidden_states.index_select(0, last_rows),
            logits=out.logits if self.keep_logits else None,  # (bs, V_draft): last rows only
        )

    def extend_block(
        self,
        window: DecodeWindow,
        tokens: torch.Tensor,
        hidden_states: torch.Tensor,
        accept_length: torch.Tensor,
        slots: torch.Tensor,
        num_tokens_per_request: int,
    ) -> DraftInput:
        """Draft-extend of a fixed width N per request over a compacted verify block.

        ``tokens`` (bs·N,) compacted predict (rows past a request's path are unspecified and
        may be −1), ``hidden_states`` (bs·N, H_in) compacted target features, ``accept_length``
        (bs,), ``slots`` (bs·N,) the verify slots (the draft KV of positions L..L+N−1 lands
        there). Row ``accept_length`` of each block read the new bonus token: its logits and
        hidden state are the next state. Causal attention keeps rows up to it clear of the
        unspecified rows after it.
        """
        bs, n = window.batch_size, num_tokens_per_request
        offsets = torch.arange(n, dtype=torch.int64, device=window.seq_lens.device)
        batch = ForwardBatch(
            mode=ForwardMode.DRAFT_EXTEND,
            input_ids=tokens.to(torch.int64).clamp(min=0),
            positions=(window.seq_lens.unsqueeze(1) + offsets).reshape(bs * n),
            seq_lens=window.seq_lens,
            req_pool_indices=window.req_pool_indices,
            out_cache_loc=slots,
            seq_lens_cpu=window.seq_lens_cpu,
            seq_lens_sum=window.seq_lens_sum,
            spec=DraftExtendSpec(num_tokens_per_request=n),
        )
        block_start = torch.arange(0, bs * n, n, device=offsets.device)  # (bs,) int64
        return self.extend_ragged(batch, hidden_states, block_start + accept_length.long())
