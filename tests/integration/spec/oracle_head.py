"""A draft *network* test double that knows the target's greedy continuation of every request.

``OracleHead`` wraps a loaded draft head (EAGLE, or MTP layer ``layer``) and is installed in
place of the container's draft models (``install_oracle_heads``), so the engine, its workers,
runners, pools, attention backends and KV mover are exactly the ones the settings build. The
real head runs on every forward (its KV goes to the draft pool); then its output is replaced:

* A row on the target's greedy path proposes the true next token second (rank 1) among
  ``topk`` nearly equally likely tokens. A node's first child in the tree is its draft's top-1
  token, so with ``topk > 1`` every accepted draft token lies on a side branch and every
  accepted path needs the KV move of compaction. (Rank 1 rather than the last rank: the
  selection of N − 1 nodes by path score keeps the top ranks of each depth.)
* A row off the path proposes a flat distribution, which keeps off-path branches out of the beam.
* Every ``WRONG_EVERY``-th position is treated as off the path, so some verify steps reject.

A row cannot see whether its ancestors were on the path (DRAFT_DECODE rows inherit their
parent's hidden state through the beam), so the head marks its output hidden states: column 0
is 1 on the path and 0 off it, column 1 holds the proposed token; ``compute_logits`` reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from dependency_injector import providers

from eagletree.adapters.models import draft_loading
from eagletree.domain.batch import ForwardBatch, ForwardMode
from tests.batch_widths import fixed_width

if TYPE_CHECKING:
    from eagletree.adapters.models.draft_loading import DraftKind, DraftModel
    from eagletree.adapters.models.layers import AttentionContext
    from eagletree.adapters.models.model_building import TargetModel
    from eagletree.adapters.models.stack import KVLayout
    from eagletree.app.composition.container import Container

ON_PATH_LOGIT = 20.0  # the topk proposals of an on-path row share almost all probability
RANK_STEP = 0.01  # keeps the proposals' probabilities distinct (no exact ties)
WRONG_EVERY = 7  # positions p with p % WRONG_EVERY == WRONG_EVERY - 1 get no true proposal

SequenceOfRow = Callable[[int], Sequence[int]]


class OracleHead:
    """``sequence_of_row(row)``: prompt + greedy continuation of the request in req_to_token row
    ``row``; MTP layer ``layer`` at position p reads token p + layer + 1 and proposes the next."""

    HOST_STAND_IN = True  # it reads the batch on the host: exempt from the sync tripwire

    def __init__(
        self, inner: DraftModel, sequence_of_row: SequenceOfRow, topk: int, layer: int = 0
    ) -> None:
        self._inner = inner
        self._sequence_of_row = sequence_of_row
        self._topk = topk
        self._layer = layer
        self.num_on_path_rows = 0

    @property
    def vocab_size(self) -> int:
        return self._inner.vocab_size

    @property
    def hidden_size(self) -> int:
        return self._inner.hidden_size

    @property
    def kv_layout(self) -> KVLayout:
        return self._inner.kv_layout

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        # input_ids, positions: (num_tokens,); hidden_states: (num_tokens, H_in)
        real: torch.Tensor = self._inner(input_ids, positions, hidden_states, ctx)
        hidden = real.clone()  # (num_tokens, H)
        on_path, proposals = self._proposals(ctx.batch, hidden_states)
        hidden[:, 0] = on_path.to(hidden.dtype).to(hidden.device)
        hidden[:, 1] = proposals.to(hidden.dtype).to(hidden.device)
        return hidden

    @property
    def token_ids(self) -> None:
        return None  # the oracle's logits are over the whole target vocabulary

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: (rows, H) marked by __call__ → (rows, V)
        vocab, k = self.vocab_size, self._topk
        # SYNC: the oracle is a host-side test double
        marks = hidden[:, :2].float().cpu()
        logits = torch.zeros(hidden.shape[0], vocab)
        for row, (mark, proposal) in enumerate(marks.tolist()):
            if mark == 1.0:
                others = [(int(proposal) + 1 + i) % vocab for i in range(k - 1)]
                ranked = [*others[:1], int(proposal), *others[1:]]
                logits[row] = -ON_PATH_LOGIT
                logits[row, ranked] = ON_PATH_LOGIT - RANK_STEP * torch.arange(k).float()
        return logits.to(hidden.device)

    def _proposals(
        self, batch: ForwardBatch, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token row: on the greedy path? and the target's token after the one it reads."""
        num_tokens = batch.num_tokens
        on_path = torch.zeros(num_tokens, dtype=torch.bool)
        proposals = torch.zeros(num_tokens, dtype=torch.int64)
        if num_tokens == 0:
            return on_path, proposals
        # SYNC: the oracle is a host-side test double
        ids, positions = batch.input_ids.tolist(), batch.positions.tolist()
        rows = batch.req_pool_indices.cpu()
        per_request = (
            batch.extend_lens.cpu()
            if batch.extend_lens is not None
            else torch.full_like(rows, fixed_width(batch))
        )
        owners = torch.repeat_interleave(rows, per_request).tolist()
        # a draft step's branch is on the path only if its parent was (the hidden's mark)
        inherited = (
            (hidden_states[:, 0] == 1.0).cpu().tolist()
            if batch.mode is ForwardMode.DRAFT_DECODE
            else [True] * num_tokens
        )
        for t in range(num_tokens):
            sequence = self._sequence_of_row(owners[t])
            read = positions[t] + self._layer + 1  # the index of the token row t reads
            if (
                read + 1 < len(sequence)
                and inherited[t]
                and ids[t] == sequence[read]
                and positions[t] % WRONG_EVERY != WRONG_EVERY - 1
            ):
                on_path[t] = True
                proposals[t] = sequence[read + 1]
        self.num_on_path_rows += int(on_path.sum())
        return on_path, proposals


def install_oracle_heads(
    container: Container, sequence_of_row: SequenceOfRow, topk: int
) -> list[OracleHead]:
    """Make ``container`` wrap every draft head it loads in an ``OracleHead`` (MTP layer i as
    layer i); returns the list the heads are appended to as they are loaded."""
    heads: list[OracleHead] = []

    def load_oracle_draft(
        path: str, kind: DraftKind, target: TargetModel, dtype: torch.dtype
    ) -> list[OracleHead]:
        loaded = draft_loading.load_draft(path, kind, target, dtype)
        oracles = [OracleHead(h, sequence_of_row, topk, i) for i, h in enumerate(loaded)]
        heads.extend(oracles)
        return oracles

    resolved = container.speculative.provided
    container.draft_models.override(
        providers.Singleton(
            load_oracle_draft,
            resolved.draft_path,
            resolved.algorithm,
            container.target_model,
            container.dtype,
        )
    )
    return heads
