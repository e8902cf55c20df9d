"""Adapter: ModelRunner and DraftRunner over a model from this package and the memory it owns.

A runner is given its KV pool, its req_to_token pool and an attention backend built over those
two; target and draft pools are sized from one slot allocator, so a slot id indexes both.
``forward`` plans the backend's metadata for the batch, runs the layers (each writes its new
k/v at ``batch.out_cache_loc``, through the backend or — fused with RoPE — straight into the
pool the context names) and returns a ``ModelOutput``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import torch

from eagletree.adapters.models.kv_rows import mha_kv_buffers
from eagletree.adapters.models.layers import AttentionContext
from eagletree.adapters.models.stack import KVLayout, TargetHidden
from eagletree.domain.model_output import ModelOutput

if TYPE_CHECKING:
    from eagletree.domain.batch import ForwardBatch
    from eagletree.ports.attention import AttentionBackend
    from eagletree.ports.memory import KVPool, ReqToTokenPool


class TargetNetwork(Protocol):
    """What ``TargetModelRunner`` needs of a target model (Llama, DeepSeek MLA)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def kv_layout(self) -> KVLayout: ...

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext
    ) -> TargetHidden: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class DraftNetwork(Protocol):
    """What ``DraftModelRunner`` needs of a draft head (EAGLE, EAGLE-3, one MTP layer)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def kv_layout(self) -> KVLayout: ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        ctx: AttentionContext,
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    @property
    def token_ids(self) -> torch.Tensor | None:
        """(V_draft,) the target id of each ``compute_logits`` column; None: the target's."""
        ...


def check_pool_fits(layout: KVLayout, pool: KVPool, what: str) -> None:
    """Raise ValueError naming every pool dimension that differs from what the model writes
    (the layer count is the pool's geometry's, the widths are the pool's own), and a pool whose
    buffers cannot take the rows the model's fused layers write themselves."""
    wanted = layout._asdict()
    direct_writes = wanted.pop("direct_writes", False)
    wrong = []
    for field, value in wanted.items():
        have = pool.geometry.layer_num if field == "layer_num" else getattr(pool, field, None)
        if have != value:
            shown = "<absent>" if have is None else have
            wrong.append(f"{field} = {shown} (the model needs {value})")
    if direct_writes and not wrong and layout.layer_num and mha_kv_buffers(pool, 0) is None:
        wrong.append(
            "its K/V buffers cannot take the rows the model's fused layers write themselves"
            " (fp8 or translated slots): build the model with fused_kernels=False"
        )
    if wrong:
        raise ValueError(
            f"{what}: the KV pool ({type(pool).__name__}) does not fit the model: "
            + "; ".join(wrong)
        )


Network = TypeVar("Network", TargetNetwork, DraftNetwork)


class RunnerBody(Generic[Network]):
    """What a target and a draft runner share: the model, the memory it owns — checked to fit
    once, here — and each forward's attention plan and logits rows."""

    role = "runner"  # names the runner in errors

    def __init__(
        self,
        model: Network,
        kv_pool: KVPool,
        req_to_token_pool: ReqToTokenPool,
        attention_backend: AttentionBackend,
    ) -> None:
        check_pool_fits(model.kv_layout, kv_pool, self.role)
        self.model: Network = model
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.attention_backend = attention_backend
        self.vocab_size = model.vocab_size
        self.hidden_size = model.hidden_size

    def _context(self, batch: ForwardBatch) -> AttentionContext:
        """The backend's metadata planned for ``batch``; the context its layers attend in."""
        self.attention_backend.init_forward_metadata(batch)
        return AttentionContext(self.attention_backend, batch, self.kv_pool)

    def _logits(self, hidden: torch.Tensor, logits_rows: torch.Tensor | None) -> torch.Tensor:
        # hidden: (num_tokens, H); logits_rows: (num_rows,) int64 -> (num_rows or num_tokens, V)
        rows = hidden if logits_rows is None else hidden.index_select(0, logits_rows)
        logits: torch.Tensor = self.model.compute_logits(rows)
        return logits


class TargetModelRunner(RunnerBody[TargetNetwork]):
    """Runs a target model; ``hidden_states`` of the output are the final-normed lm_head inputs."""

    role = "target runner"

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, logits_rows: torch.Tensor | None = None) -> ModelOutput:
        out = self.model(batch.input_ids, batch.positions, self._context(batch))
        logits = self._logits(out.hidden, logits_rows)
        return ModelOutput(logits=logits, hidden_states=out.hidden, aux_hidden_states=out.aux)


class DraftModelRunner(RunnerBody[DraftNetwork]):
    """Runs one draft head; output ``hidden_states`` are what its next draft step consumes and
    logits are over the draft's vocabulary, whose target ids the output's ``token_ids`` give."""

    role = "draft runner"

    @property
    def token_ids(self) -> torch.Tensor | None:
        return self.model.token_ids

    @torch.no_grad()
    def forward(
        self,
        batch: ForwardBatch,
        hidden_states: torch.Tensor,
        logits_rows: torch.Tensor | None = None,
    ) -> ModelOutput:
        # hidden_states: (num_tokens, H), or (num_tokens, 3·H) for EAGLE-3 fed by the target
        if hidden_states.shape[0] != batch.num_tokens:
            raise ValueError(
                f"draft forward: {hidden_states.shape[0]} hidden rows for {batch.num_tokens} tokens"
            )
        ctx = self._context(batch)
        hidden = self.model(batch.input_ids, batch.positions, hidden_states, ctx)
        logits = self._logits(hidden, logits_rows)
        return ModelOutput(logits=logits, hidden_states=hidden, token_ids=self.model.token_ids)
