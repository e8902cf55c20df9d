"""Adapter: the EAGLE-1 draft head — ``fc([embed(token); hidden])`` and Llama decoder layers.

Shape of SafeAILab's ``cnets.Model`` (and SGLang's ``LlamaForCausalLMEagle``): the fc output goes
into the first decoder layer without an input norm, the last layer's output (residual stream, no
final norm) is both the next draft step's hidden state and the input of the target's lm_head.
The embedding and the lm_head are the target's, shared and not owned — unless a token map
(FR-Spec's hot tokens, SGLang's ``--speculative-token-map``) restricts the head to part of the
vocabulary: it then owns a copy of the target's lm_head rows for those tokens, and its logits'
columns are named by ``token_ids``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from eagletree.adapters.models.config import LlamaConfig
from eagletree.adapters.models.layers import AttentionContext
from eagletree.adapters.models.llama import fold_layer_norms, llama_decoder_layer
from eagletree.adapters.models.rotary import RotaryEmbedding
from eagletree.adapters.models.stack import mha_layout
from eagletree.adapters.models.tensor_parallel import SINGLE, ColumnParallelLinear, TensorParallel


class SharedTargetModules(NamedTuple):
    """The target's embedding and lm_head, borrowed by a draft (a tuple keeps them unregistered,
    so they are neither in the draft's state dict nor moved by the draft's ``to``)."""

    embed_tokens: nn.Embedding
    lm_head: nn.Linear


class EagleDraft(nn.Module):
    """EAGLE-1: ``hidden_states`` are the target's final-normed features (H) or this head's own
    output from the previous draft step. Tensor-parallel over the target's ``tp``: the decoder
    layers are sharded as the target's are, the small ``fc`` is replicated."""

    token_ids: torch.Tensor | None

    def __init__(
        self,
        config: LlamaConfig,
        shared: SharedTargetModules,
        fc_bias: bool,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        self.vocab_size, self.hidden_size = config.vocab_size, config.hidden_size
        self.shared = shared
        self.tp = tp
        self.kv_layout = mha_layout(config, config.num_hidden_layers, tp, fused_kernels)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList(
            llama_decoder_layer(
                config, i, skip_input_norm=(i == 0), fused_kernels=fused_kernels, tp=tp
            )
            for i in range(config.num_hidden_layers)
        )
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, fused_kernels=fused_kernels)
        self.fused_kernels = fused_kernels
        # set by restrict_vocabulary: the lm_head rows of the mapped tokens, and their ids (the
        # target id of each logits column under a token map; None without one)
        self.mapped_lm_head: ColumnParallelLinear | None = None
        self.register_buffer("token_ids", None, persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        # input_ids, positions: (num_tokens,); hidden_states: (num_tokens, H) -> (num_tokens, H)
        embeds = self.shared.embed_tokens(input_ids)
        h = self.fc(torch.cat((embeds, hidden_states.to(embeds.dtype)), dim=-1))
        rope = self.rotary(positions, h.dtype)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            h, residual = layer(h, residual, rope, ctx)
        out: torch.Tensor = h if residual is None else residual + h
        return out

    def fold_norms(self) -> None:
        """Each layer's norms folded into its projections (``LlamaDecoderLayer.folded``)."""
        fold_layer_norms(self.layers)

    def restrict_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Propose only ``token_ids`` (distinct target ids): the head's logits become those
        tokens' rows of the target's lm_head, copied once (gathered from every rank when the
        target's lm_head is sharded by vocabulary) and replicated, as an EAGLE-3 head's are."""
        # token_ids: (V_mapped,) int64
        weight = self.shared.lm_head.weight  # (V / W, H) on this rank
        tp: TensorParallel = getattr(self.shared.lm_head, "tp", SINGLE)
        with torch.no_grad():
            rows = tp.all_gather_last(weight.t()).t() if tp.is_parallel else weight  # (V, H)
            ids = token_ids.to(device=weight.device, dtype=torch.int64)
            head = ColumnParallelLinear(
                self.hidden_size, ids.numel(), False, fused_kernels=self.fused_kernels
            ).to(device=weight.device, dtype=weight.dtype)
            head.weight.copy_(rows.index_select(0, ids))
        self.mapped_lm_head = head
        self.token_ids = ids

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, H) draft output -> (rows, V) logits through the target's lm_head (its dtype),
        or (rows, V_mapped) through the mapped tokens' rows."""
        head = self.shared.lm_head if self.mapped_lm_head is None else self.mapped_lm_head
        logits: torch.Tensor = head(hidden)
        return logits
