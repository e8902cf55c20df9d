"""Port: model runners — a target model or a draft head together with the memory it owns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from eagletree.domain.batch import ForwardBatch
    from eagletree.domain.model_output import ModelOutput
    from eagletree.ports.attention import AttentionBackend
    from eagletree.ports.memory import KVPool, ReqToTokenPool


class ModelRunner(Protocol):
    """Runs the target model. A runner owns its KV pool, req_to_token pool and attention backend.

    ``forward(batch, logits_rows)`` writes the KV of the batch's tokens at ``out_cache_loc`` and
    returns a ``ModelOutput``; ``logits_rows`` (num_rows,) int64 selects which token rows get
    logits (None = every token; prefill asks for each request's last token only).
    """

    @property
    def kv_pool(self) -> KVPool: ...

    @property
    def req_to_token_pool(self) -> ReqToTokenPool: ...

    @property
    def attention_backend(self) -> AttentionBackend: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    def forward(
        self, batch: ForwardBatch, logits_rows: torch.Tensor | None = None
    ) -> ModelOutput: ...


class DraftRunner(Protocol):
    """Runs one draft head (EAGLE, EAGLE-3, or one MTP layer) over its own pools.

    ``forward(batch, hidden_states, logits_rows)``: token i of the batch is paired with
    ``hidden_states[i]`` — the target's hidden state (aux hidden states for EAGLE-3) at the
    previous position, or the draft's own output hidden state on later draft steps. Logits are
    over the draft's vocabulary: where that is part of the target's (an EAGLE-3 draft
    vocabulary, an EAGLE token map), ``ModelOutput.token_ids`` maps each column to its target
    token, so a top-k runs over the draft's columns only.
    """

    @property
    def kv_pool(self) -> KVPool: ...

    @property
    def req_to_token_pool(self) -> ReqToTokenPool: ...

    @property
    def attention_backend(self) -> AttentionBackend: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def token_ids(self) -> torch.Tensor | None:
        """(vocab_size,) int64 the target id of each logits column; None: column i is token i
        (what every forward's ``ModelOutput.token_ids`` is, known before any forward)."""
        ...

    def forward(
        self,
        batch: ForwardBatch,
        hidden_states: torch.Tensor,
        logits_rows: torch.Tensor | None = None,
    ) -> ModelOutput: ...
