"""Adapter: the DeepSeek-V3-style MLA target (HF ``DeepseekV3ForCausalLM``, dense MLPs only).

Attention runs in the absorbed form over an ``MLAKVPool``: the pool row of a token is its
normalised latent (``kv_lora_rank``) followed by its rotated rope key (``qk_rope_head_dim``).
Each head's no-rope query is mapped into latent space through the key half of ``kv_b_proj``,
so scores are ``q_latent · latent + q_rope · k_rope``; the backend returns the attention-weighted
latent of each head, which the value half of ``kv_b_proj`` maps to the head's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from eagletree.adapters.kernels.triton.mla_rope_kv_store import mla_rope_kv_store
from eagletree.adapters.models.config import MLAConfig
from eagletree.adapters.models.dense_group import DenseGroup
from eagletree.adapters.models.dense_layers import swiglu_over
from eagletree.adapters.models.layers import AttentionContext, PreNormDecoderLayer, rms_norm
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding, yarn_mscale
from eagletree.adapters.models.stack import (
    DecoderOnlyLM,
    MLALayout,
)
from eagletree.adapters.models.tensor_parallel import (
    SINGLE,
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
)
from eagletree.domain.attention_layer import AttentionLayer

if TYPE_CHECKING:
    from eagletree.ports.memory import MLAKVCache


def mla_softmax_scale(config: MLAConfig) -> float:
    """1/sqrt(qk_head_dim), times mscale² for scaled rope (transformers' ``yarn_apply_mscale``)."""
    scale: float = config.qk_head_dim**-0.5
    rope = config.rope
    if rope.rope_type != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


class MLAAttention(nn.Module):
    """MLA attention through the torch reference: the latent normalised, q_rope and k_rope
    rotated by ``RopeTables.rotate``, the pool row stored by the backend. With a q LoRA,
    ``q_a_proj`` and ``kv_a_proj_with_mqa`` read the same input and run as one GEMM
    (``fused_qkv_a_proj``, filled from both checkpoint tensors).

    Tensor-parallel: the latent (``kv_a``, its norm, the pool row) is replicated on every rank;
    a rank owns ``heads / W`` heads — their rows of ``q_b_proj`` / ``q_proj`` and ``kv_b_proj``
    — and ``o_proj`` sums the ranks' head outputs (one all-reduce)."""

    def __init__(
        self,
        config: MLAConfig,
        layer_id: int,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        hidden, heads = config.hidden_size, config.num_attention_heads
        bias, eps = config.attention_bias, config.rms_norm_eps
        kv_a_rows = config.kv_lora_rank + config.qk_rope_head_dim
        self.num_local_heads = tp.split(heads, "num_attention_heads")
        q_rows = heads * config.qk_head_dim
        self.q_proj: nn.Linear | None = None
        self.kv_a_proj_with_mqa: nn.Linear | None = None
        self.fused_qkv_a_proj: MergedLinear | None = None
        if config.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, q_rows, False, tp)
            self.kv_a_proj_with_mqa = nn.Linear(hidden, kv_a_rows, bias=bias)
        else:
            parts = (("q_a_proj", config.q_lora_rank), ("kv_a_proj_with_mqa", kv_a_rows))
            self.fused_qkv_a_proj = MergedLinear(hidden, parts, bias=bias)
            self.q_a_layernorm = rms_norm(config.q_lora_rank, eps, fused_kernels)
            self.q_b_proj = ColumnParallelLinear(config.q_lora_rank, q_rows, False, tp)
        self.kv_a_layernorm = rms_norm(config.kv_lora_rank, eps, fused_kernels)
        kv_b_rows = heads * (config.qk_nope_head_dim + config.v_head_dim)
        self.kv_b_proj = ColumnParallelLinear(config.kv_lora_rank, kv_b_rows, False, tp)
        self.o_proj = RowParallelLinear(
            heads * config.v_head_dim, hidden, bias=bias, tp=tp, fused_kernels=fused_kernels
        )
        self.layer = AttentionLayer(
            layer_id=layer_id,
            num_q_heads=self.num_local_heads,
            num_kv_heads=1,
            head_dim=config.kv_lora_rank + config.qk_rope_head_dim,
            v_head_dim=config.kv_lora_rank,
            scaling=mla_softmax_scale(config),
            is_mla=True,
        )

    def _query_and_compressed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: (num_tokens, hidden) -> q (num_tokens, heads·qk_head_dim), (num_tokens, rank + rope)
        if self.fused_qkv_a_proj is None:
            assert self.q_proj is not None and self.kv_a_proj_with_mqa is not None
            return self.q_proj(x), self.kv_a_proj_with_mqa(x)
        q_a, compressed = self.fused_qkv_a_proj.split(self.fused_qkv_a_proj(x))
        q: torch.Tensor = self.q_b_proj(self.q_a_layernorm(q_a))
        return q, compressed

    def forward(self, x: torch.Tensor, rope: RopeTables, ctx: AttentionContext) -> torch.Tensor:
        # x: (num_tokens, hidden)
        cfg = self.config
        num_tokens, heads = x.shape[0], self.num_local_heads
        nope, rope_dim, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        q, compressed = self._query_and_compressed(x)
        q_nope, q_rope = torch.split(
            q.view(num_tokens, heads, nope + rope_dim), [nope, rope_dim], -1
        )
        latent, k_rope = torch.split(compressed, [rank, rope_dim], dim=-1)
        # kv_b: (heads, nope + v_head_dim, rank); its rows map a latent to [k_nope; v] per head
        kv_b = self.kv_b_proj.weight.view(heads, nope + cfg.v_head_dim, rank)
        # q_latent: (heads, num_tokens, rank) = q_nope · W_uk per head
        q_latent = torch.bmm(q_nope.transpose(0, 1), kv_b[:, :nope, :])
        # o_latent: (num_tokens, heads * rank)
        o_latent = self._attend_latent(q_latent, q_rope, latent, k_rope, compressed, rope, ctx)
        # o: (heads, num_tokens, v_head_dim) = o_latent · W_uv^T per head
        o = torch.bmm(
            o_latent.view(num_tokens, heads, rank).transpose(0, 1),
            kv_b[:, nope:, :].transpose(1, 2),
        )
        # an explicit width: an idle batch (num_tokens == 0) cannot infer -1
        out: torch.Tensor = self.o_proj(o.transpose(0, 1).reshape(num_tokens, heads * o.shape[-1]))
        return out

    def _attend_latent(
        self,
        q_latent: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        compressed: torch.Tensor,
        rope: RopeTables,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        # q_latent: (heads, n, rank); q_rope: (n, heads, rope); latent: (n, rank) and
        # k_rope: (n, rope), column blocks of compressed (n, rank + rope) -> (n, heads · rank)
        num_tokens, rank = latent.shape
        latent = self.kv_a_layernorm(latent)
        q_rope = rope.rotate(q_rope)
        k_rope = rope.rotate(k_rope.view(num_tokens, 1, k_rope.shape[-1]))
        # q: (num_tokens, heads, rank + rope); k: (num_tokens, 1, rank + rope)
        q = torch.cat((q_latent.transpose(0, 1), q_rope), dim=-1)
        k = torch.cat((latent.view(num_tokens, 1, rank), k_rope), dim=-1)
        return ctx.backend.forward(q, k, None, self.layer, ctx.batch)


class FusedMLAAttention(MLAAttention):
    """``MLAAttention`` whose prologue is one kernel (``mla_rope_kv_store``): it normalises the
    latent, rotates q_rope and k_rope (either layout) and writes the pool row [latent; k_rope]
    of the runner's MLA pool at ``out_cache_loc`` itself; the backend runs with
    ``save_kv=False``."""

    def _attend_latent(
        self,
        q_latent: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        compressed: torch.Tensor,
        rope: RopeTables,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        pool: MLAKVCache = ctx.kv_pool  # type: ignore[assignment]
        norm, rank = self.kv_a_layernorm, latent.shape[-1]
        # q: (num_tokens, heads, rank + rope) with its rope columns rotated; the pool rows
        # at out_cache_loc get [norm(latent); rotate(k_rope)]
        q = mla_rope_kv_store(
            q_rope, latent, k_rope, norm.weight, norm.eps, rope.cos, rope.sin,
            rope.interleaved, ctx.batch.out_cache_loc, pool.get_kv_buffer(self.layer.layer_id),
        )  # fmt: skip
        q[..., :rank].copy_(q_latent.transpose(0, 1))
        # k is ignored with save_kv=False: the backend reads every key from the pool
        k = compressed.unsqueeze(1)
        return ctx.backend.forward(q, k, None, self.layer, ctx.batch, save_kv=False)


class MLADecoderLayer(PreNormDecoderLayer):
    """MLA attention and SwiGLU as a ``PreNormDecoderLayer``, with the Triton kernels' blocks
    (``FusedMLAAttention``, ``FusedRMSNorm``) or the torch reference's; ``dense``: the MLP
    sharded over that data-parallel group instead of ``tp``."""

    def __init__(
        self,
        config: MLAConfig,
        layer_id: int,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
        dense: DenseGroup | None = None,
    ) -> None:
        hidden, eps = config.hidden_size, config.rms_norm_eps
        attention = FusedMLAAttention if fused_kernels else MLAAttention
        super().__init__(
            rms_norm(hidden, eps, fused_kernels),
            attention(config, layer_id, fused_kernels, tp),
            rms_norm(hidden, eps, fused_kernels),
            swiglu_over(hidden, config.intermediate_size, False, fused_kernels, tp, dense),
        )


def mla_rotary(config: MLAConfig, fused_kernels: bool = False) -> RotaryEmbedding:
    return RotaryEmbedding(
        config.rope,
        config.qk_rope_head_dim,
        interleaved=config.rope_interleave,
        fused_kernels=fused_kernels,
    )


class DeepseekMLAForCausalLM(DecoderOnlyLM):
    """Embedding, MLA decoder layers with dense MLPs, final norm and lm_head; tensor-parallel
    over ``tp`` as ``LlamaForCausalLM`` is (attention by heads over a replicated latent), or
    with ``dense`` its embedding, MLPs and lm_head over that data-parallel group."""

    config: MLAConfig

    def __init__(
        self,
        config: MLAConfig,
        aux_layer_ids: Sequence[int] = (),
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
        dense: DenseGroup | None = None,
    ) -> None:
        super().__init__(
            config,
            aux_layer_ids,
            fused_kernels,
            tp,
            dense,
            layer=lambda i: MLADecoderLayer(config, i, fused_kernels, tp, dense),
            rotary=mla_rotary(config, fused_kernels),
        )
        layers, rank, rope = config.num_hidden_layers, config.kv_lora_rank, config.qk_rope_head_dim
        self.kv_layout = MLALayout(layers, rank, rope)
