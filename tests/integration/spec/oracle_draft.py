"""A DraftRunner test double that knows the target's greedy continuation of every request.

``OracleDraft`` wraps a real draft runner: the real forward runs (so the draft pool, the draft
attention modes and every shape are exercised), then the logits are replaced. A row that lies
on the target's greedy path proposes the target's true next token at a *random rank* among k
nearly equally likely tokens, so the true path is often a non-first branch and deep acceptance
needs compaction; a row off the path proposes a flat distribution, which keeps off-path
branches out of the beam. Whether a DRAFT_DECODE row is on the path depends on its ancestors,
which the row cannot see, so the oracle marks its own output hidden states: column 0 is 1 on
the path and 0 off it, and a branch inherits its parent's hidden state through the beam.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from eagletree.adapters.models.runner import DraftModelRunner
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.model_output import ModelOutput
from tests.batch_widths import fixed_width
from tests.integration.spec.wrapped_draft_runner import WrappedDraftRunner

ON_PATH_LOGIT = 20.0  # the k proposals of an on-path row share almost all probability
RANK_STEP = 0.01  # keeps the k proposals' probabilities distinct (no exact ties)


class OracleDraft(WrappedDraftRunner):
    """``sequence_of_row(row)`` returns the greedy sequence (prompt + reference continuation)
    of the request that owns req_to_token row ``row``; positions past it are off the path."""

    def __init__(
        self,
        inner: DraftModelRunner,
        sequence_of_row: Callable[[int], Sequence[int]],
        topk: int,
        seed: int = 0,
    ) -> None:
        super().__init__(inner)
        self._sequence_of_row = sequence_of_row
        self._topk = topk
        self._generator = torch.Generator().manual_seed(seed)
        self.num_on_path_rows = 0

    def forward(
        self,
        batch: ForwardBatch,
        hidden_states: torch.Tensor,
        logits_rows: torch.Tensor | None = None,
    ) -> ModelOutput:
        out = self._inner.forward(batch, hidden_states, logits_rows)
        on_path, proposals = self._next_tokens(batch, hidden_states)  # (num_tokens,) each
        rows = torch.arange(batch.num_tokens) if logits_rows is None else logits_rows.cpu()
        logits = torch.zeros(rows.shape[0], self.vocab_size)
        for i, token_row in enumerate(rows.tolist()):
            if on_path[token_row]:
                logits[i] = self._ranked_logits(int(proposals[token_row]))
        hidden = out.hidden_states.clone()
        hidden[:, 0] = on_path.to(hidden.dtype).to(hidden.device)
        return ModelOutput(logits=logits.to(out.logits.device), hidden_states=hidden)

    def _next_tokens(
        self, batch: ForwardBatch, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token row: on the greedy path? and the target's token after it."""
        num_tokens = batch.num_tokens
        on_path = torch.zeros(num_tokens, dtype=torch.bool)
        proposals = torch.zeros(num_tokens, dtype=torch.int64)
        if num_tokens == 0:
            return on_path, proposals
        ids = batch.input_ids.cpu().tolist()
        positions = batch.positions.cpu().tolist()
        owners = self._owner_rows(batch)
        # a draft step's branch is on the path only if its parent was (the hidden's mark)
        inherited = (
            hidden_states[:, 0].cpu() == 1.0
            if batch.mode is ForwardMode.DRAFT_DECODE
            else torch.ones(num_tokens, dtype=torch.bool)
        )
        for t in range(num_tokens):
            sequence = self._sequence_of_row(owners[t])
            p = positions[t]  # the row reads the token at p + 1 and predicts the one at p + 2
            if p + 2 < len(sequence) and bool(inherited[t]) and ids[t] == sequence[p + 1]:
                on_path[t] = True
                proposals[t] = sequence[p + 2]
        self.num_on_path_rows += int(on_path.sum())
        return on_path, proposals

    def _owner_rows(self, batch: ForwardBatch) -> list[int]:
        rows = batch.req_pool_indices.cpu()
        if batch.mode is ForwardMode.EXTEND:
            assert batch.extend_lens is not None
            per_request = batch.extend_lens.cpu()
        else:
            per_request = torch.full_like(rows, fixed_width(batch))
        owners: list[int] = torch.repeat_interleave(rows, per_request).tolist()
        return owners

    def _ranked_logits(self, token: int) -> torch.Tensor:
        """Logits whose top k holds ``token`` at a uniformly random rank."""
        k = self._topk
        rank = int(torch.randint(0, k, (1,), generator=self._generator))
        others = torch.randperm(self.vocab_size, generator=self._generator)
        others = others[others != token][: k - 1]
        ranked = torch.cat([others[:rank], torch.tensor([token]), others[rank:]])
        logits = torch.full((self.vocab_size,), -ON_PATH_LOGIT)
        logits[ranked] = ON_PATH_LOGIT - RANK_STEP * torch.arange(k, dtype=torch.float32)
        return logits
