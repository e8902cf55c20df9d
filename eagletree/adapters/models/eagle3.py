"""Adapter: the EAGLE-3 draft head (SafeAILab / SpecForge ``LlamaForCausalLMEagle3``).

``fc`` fuses the target's three captured hidden states (3·H_target -> H); the midlayer's q/k/v
read ``[input_layernorm(embed); hidden_norm(hidden)]`` (2·H); its own ``norm`` and ``lm_head``
produce logits over a draft vocabulary, whose columns ``token_ids`` maps to target token ids
(``target = draft + d2t[draft]``): a draft step's top-k runs over the draft vocabulary and maps
its picks. The embedding is the target's.
"""

from __future__ import annotations

import torch
from torch import nn

from eagletree.adapters.models.config import LlamaConfig
from eagletree.adapters.models.eagle import SharedTargetModules
from eagletree.adapters.models.layers import AttentionContext, SwiGLU, rms_norm
from eagletree.adapters.models.llama_attention import llama_attention
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding
from eagletree.adapters.models.stack import mha_layout
from eagletree.adapters.models.tensor_parallel import SINGLE, ColumnParallelLinear, TensorParallel


class Eagle3MidLayer(nn.Module):
    def __init__(
        self, config: LlamaConfig, fused_kernels: bool = False, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = rms_norm(hidden, eps, fused_kernels)
        self.hidden_norm = rms_norm(hidden, eps, fused_kernels)
        self.self_attn = llama_attention(
            config, layer_id=0, input_size=2 * hidden, fused_kernels=fused_kernels, tp=tp
        )
        self.post_attention_layernorm = rms_norm(hidden, eps, fused_kernels)
        self.mlp = SwiGLU(hidden, config.intermediate_size, config.mlp_bias, fused_kernels, tp)

    def forward(
        self, embeds: torch.Tensor, h: torch.Tensor, rope: RopeTables, ctx: AttentionContext
    ) -> torch.Tensor:
        # embeds, h: (num_tokens, H); the residual stream starts at the fused hidden state, which
        # may be the caller's tensor, so the first add writes a new one
        x = self.input_layernorm.concat(embeds, self.hidden_norm, h)
        attn = self.self_attn(x, rope, ctx)
        x, residual = self.post_attention_layernorm.add(attn, h, reuse_residual=False)
        out: torch.Tensor = residual + self.mlp(x)
        return out


class Eagle3Draft(nn.Module):
    """``hidden_states`` are the target's aux states (3·H_target, fused by ``fc``) or this head's
    own pre-norm output (H) from the previous draft step; the width tells which.
    Tensor-parallel over the target's ``tp``: the midlayer is sharded; ``fc``, the norm and the
    draft-vocabulary lm_head are small and replicated (every rank computes all draft logits)."""

    d2t: torch.Tensor
    draft_to_target: torch.Tensor

    def __init__(
        self,
        config: LlamaConfig,
        shared: SharedTargetModules,
        draft_vocab_size: int,
        target_hidden_size: int,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        if 3 * target_hidden_size == config.hidden_size:
            raise ValueError(
                f"EAGLE-3 head: 3 x target hidden ({target_hidden_size}) equals the draft hidden"
                f" size ({config.hidden_size}), so fused and draft hidden states cannot be told"
                " apart"
            )
        self.config = config
        self.vocab_size, self.hidden_size = config.vocab_size, config.hidden_size
        self.shared = shared
        self.tp = tp
        self.kv_layout = mha_layout(config, 1, tp, fused_kernels)
        self.draft_vocab_size = draft_vocab_size
        self.fc = nn.Linear(3 * target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3MidLayer(config, fused_kernels, tp)
        self.norm = rms_norm(config.hidden_size, config.rms_norm_eps, fused_kernels)
        # replicated under tensor parallelism: a ColumnParallelLinear of one block
        self.lm_head = ColumnParallelLinear(
            config.hidden_size, draft_vocab_size, False, fused_kernels=fused_kernels
        )
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, fused_kernels=fused_kernels)
        # d2t: (draft_vocab,) int64 offsets as published; draft_to_target: draft id -> target id
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.int64))
        self.register_buffer(
            "draft_to_target", torch.arange(draft_vocab_size, dtype=torch.int64), persistent=False
        )

    def reset_vocab_map(self) -> None:
        """Recompute ``draft_to_target`` after ``d2t`` was loaded."""
        with torch.no_grad():
            ids = torch.arange(self.draft_vocab_size, device=self.d2t.device)
            self.draft_to_target = ids + self.d2t

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        # input_ids, positions: (num_tokens,); hidden_states: (num_tokens, 3·H_t or H)
        embeds = self.shared.embed_tokens(input_ids)
        h = hidden_states.to(embeds.dtype)
        if h.shape[-1] == self.fc.in_features:
            h = self.fc(h)
        rope = self.rotary(positions, h.dtype)
        out: torch.Tensor = self.midlayer(embeds, h, rope, ctx)
        return out

    @property
    def token_ids(self) -> torch.Tensor | None:
        """Draft id -> target id; None where the draft vocabulary is the target's."""
        return None if self.draft_vocab_size == self.config.vocab_size else self.draft_to_target

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, H) -> (rows, V_draft) in the model's dtype; ``token_ids`` names the columns
        (no 128k-wide row of −inf is written for the draft's 32k)."""
        logits: torch.Tensor = self.lm_head(self.norm(hidden))
        return logits
