"""Adapter: the EAGLE-1 draft head — ``fc([embed(token); hidden])`` and Llama decoder layers.

Shape of SafeAILab's ``cnets.Model`` (and SGLang's ``LlamaForCausalLMEagle``): the fc output goes
into the first decoder layer without an input norm, the last layer's output (residual stream, no
final norm) is both the next draft step's hidden state and the input of the target's lm_head.
The embedding and the lm_head are the target's, shared and not owned.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from eagletree.adapters.models.config import LlamaConfig
from eagletree.adapters.models.layers import AttentionContext, RotaryEmbedding
from eagletree.adapters.models.llama import LlamaDecoderLayer, fold_layer_norms
from eagletree.adapters.models.stack import MHALayout, mha_layout
from eagletree.adapters.models.tensor_parallel import SINGLE, TensorParallel


class SharedTargetModules(NamedTuple):
    """The target's embedding and lm_head, borrowed by a draft (a tuple keeps them unregistered,
    so they are neither in the draft's state dict nor moved by the draft's ``to``)."""

    embed_tokens: nn.Embedding
    lm_head: nn.Linear


class EagleDraft(nn.Module):
    """EAGLE-1: ``hidden_states`` are the target's final-normed features (H) or this head's own
    output from the previous draft step. Tensor-parallel over the target's ``tp``: the decoder
    layers are sharded as the target's are, the small ``fc`` is replicated."""

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
        self.shared = shared
        self.tp = tp
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                config, i, skip_input_norm=(i == 0), fused_kernels=fused_kernels, tp=tp
            )
            for i in range(config.num_hidden_layers)
        )
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def kv_layout(self) -> MHALayout:
        return mha_layout(self.config, len(self.layers), self.tp)

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
        fold_layer_norms(self.layers)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, H) draft output -> (rows, V) logits through the target's lm_head (its dtype)."""
        logits: torch.Tensor = self.shared.lm_head(hidden)
        return logits
