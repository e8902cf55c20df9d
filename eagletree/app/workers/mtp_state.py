"""The multi-layer MTP worker's per-request state: the chain's drafts and the kept positions.

Every draft-extend of the worker starts ``S − 1`` rows before the committed length L (fewer
while L is shorter), recomputing those rows from tokens the target has since confirmed. So
besides the pending bonus token and the S chain drafts it keeps, per request, the target hidden
states of the last S − 1 committed positions and the tokens after them (the next extend's front
rows), all on the device, indexed by req_to_token row.
"""

from __future__ import annotations

import torch

from eagletree.app.workers.draft_state import DraftInput, DraftStateStore


def kept_rows(last_rows: torch.Tensor, keep: int) -> torch.Tensor:
    """The ``keep`` batch rows ending at each request's bonus row ``last_rows`` (bs,) →
    (bs, keep) int64, oldest first. Rows before a request's first one belong to another request
    (clamped to row 0 at the batch's start): they are read only while the request is shorter
    than ``keep`` tokens, when the ragged step builds its front rows on the host instead."""
    back = torch.arange(keep - 1, -1, -1, device=last_rows.device)
    return (last_rows.unsqueeze(1) - back).clamp(min=0)


class MtpStateStore(DraftStateStore):
    """A ``DraftStateStore`` of S chain drafts per request (``topk_index`` (S,), their draft
    probabilities ``topk_p``), whose ``hidden_states`` are the target hidden states of the last
    S − 1 committed positions, oldest first, flattened to ((S − 1)·H,); ``front_tokens``
    (rows, S − 1) int64 holds the tokens after those positions."""

    def __init__(
        self,
        num_rows: int,
        *,
        num_steps: int,
        hidden_size: int,
        hidden_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(
            num_rows=num_rows,
            topk=num_steps,
            hidden_size=(num_steps - 1) * hidden_size,
            hidden_dtype=hidden_dtype,
            device=device,
        )
        self._keep = num_steps - 1
        self._position_hidden_size = hidden_size
        self.front_tokens = torch.zeros(num_rows, self._keep, dtype=torch.int64, device=device)

    def keep(
        self,
        rows: torch.Tensor,
        tokens: torch.Tensor,
        target_hidden: torch.Tensor,
        drafts: torch.Tensor,
        probs: torch.Tensor,
        last_rows: torch.Tensor,
    ) -> None:
        """Store at ``rows`` (bs,) the state after an extend whose rows ``last_rows`` (bs,) sit
        at each request's last committed position; device ops only.

        ``tokens`` (num_tokens,) the extend's layer-0 inputs (the token after each row's
        position: at ``last_rows`` the new bonus tokens), ``target_hidden`` (num_tokens, H) the
        target hidden states it read, ``drafts`` / ``probs`` (bs, S) the chain's proposals.
        Keeps the hidden states and tokens of each bonus row and the S − 2 rows before it.
        """
        bs = last_rows.shape[0]
        kept = kept_rows(last_rows, self._keep)  # (bs, S − 1)
        hidden = target_hidden.index_select(0, kept.reshape(-1))
        state = DraftInput(
            bonus_tokens=tokens.index_select(0, last_rows),
            topk_p=probs,
            topk_index=drafts,
            hidden_states=hidden.reshape(bs, self._keep * self._position_hidden_size),
        )
        self.scatter(rows, state)
        self.front_tokens[rows] = tokens.to(torch.int64)[kept]
