"""Adapter: one DeepSeek-style multi-token-prediction layer as a draft head.

``h = decoder(eh_proj([enorm(embed(token)); hnorm(hidden)]))`` then ``shared_head.norm``; the
normed output is both the next layer's hidden input and the lm_head input (SGLang's
``DeepseekV3ForCausalLMNextN``, transformers' ``MtpLayer`` with its post norm). The decoder layer
has the target's architecture (MLA for DeepSeek, GQA for Llama); embedding and lm_head are the
target's. A multi-layer MTP draft is one of these per layer, each with its own runner and pools.
"""

from __future__ import annotations

import torch
from torch import nn

from eagletree.adapters.models.config import LlamaConfig, MLAConfig
from eagletree.adapters.models.deepseek_mla import MLADecoderLayer, mla_rotary
from eagletree.adapters.models.eagle import SharedTargetModules
from eagletree.adapters.models.layers import AttentionContext, rms_norm
from eagletree.adapters.models.llama import LlamaDecoderLayer, llama_decoder_layer
from eagletree.adapters.models.rotary import RotaryEmbedding
from eagletree.adapters.models.stack import KVLayout, MLALayout, mha_layout
from eagletree.adapters.models.tensor_parallel import SINGLE, TensorParallel


class SharedHead(nn.Module):
    """Holds ``shared_head.norm`` under the checkpoint's name."""

    def __init__(self, hidden_size: int, eps: float, fused_kernels: bool) -> None:
        super().__init__()
        self.norm = rms_norm(hidden_size, eps, fused_kernels)


class MTPLayer(nn.Module):
    """``hidden_states``: the target's final-normed features or the previous MTP layer's output.
    Tensor-parallel over the target's ``tp``: the decoder layer is sharded, ``eh_proj`` and the
    norms are replicated."""

    token_ids = None  # the logits are over the whole target vocabulary

    def __init__(
        self,
        config: LlamaConfig | MLAConfig,
        shared: SharedTargetModules,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        self.vocab_size, self.hidden_size = config.vocab_size, config.hidden_size
        self.shared = shared
        self.tp = tp
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = rms_norm(hidden, eps, fused_kernels)
        self.hnorm = rms_norm(hidden, eps, fused_kernels)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.decoder: LlamaDecoderLayer | MLADecoderLayer
        self.rotary: RotaryEmbedding
        if isinstance(config, MLAConfig):
            self.decoder = MLADecoderLayer(config, layer_id=0, fused_kernels=fused_kernels, tp=tp)
            self.rotary = mla_rotary(config, fused_kernels)
            self.kv_layout: KVLayout = MLALayout(1, config.kv_lora_rank, config.qk_rope_head_dim)
        else:
            self.decoder = llama_decoder_layer(config, 0, fused_kernels=fused_kernels, tp=tp)
            self.rotary = RotaryEmbedding(config.rope, config.head_dim, fused_kernels=fused_kernels)
            self.kv_layout = mha_layout(config, 1, tp, fused_kernels)
        self.shared_head = SharedHead(hidden, eps, fused_kernels)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        # input_ids, positions: (num_tokens,); hidden_states: (num_tokens, H) -> (num_tokens, H)
        embeds = self.shared.embed_tokens(input_ids)
        fused = self.enorm.concat(embeds, self.hnorm, hidden_states.to(embeds.dtype))
        h = self.eh_proj(fused)
        h, residual = self.decoder(h, None, self.rotary(positions, h.dtype), ctx)
        out, _ = self.shared_head.norm.add(h, residual)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, H) normed MTP output -> (rows, V) logits through the target's lm_head."""
        logits: torch.Tensor = self.shared.lm_head(hidden)
        return logits
