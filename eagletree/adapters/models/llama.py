"""Adapter: the Llama-architecture target (HF ``LlamaForCausalLM``) with attention through the port.

Module and parameter names are those of the HF checkpoint without the ``model.`` prefix, so that
loading is a rename and a shape check.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from eagletree.adapters.kernels.triton.rope_kv_store import rope_kv_store
from eagletree.adapters.models.config import LlamaConfig
from eagletree.adapters.models.dense_group import DenseGroup
from eagletree.adapters.models.dense_layers import embedding_over, lm_head_over, swiglu_over
from eagletree.adapters.models.kv_rows import mha_kv_buffers
from eagletree.adapters.models.layers import (
    AttentionContext,
    PreNormDecoderLayer,
    RMSNorm,
    fold_rms_weight,
)
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding
from eagletree.adapters.models.stack import (
    MHALayout,
    TargetHidden,
    check_aux_layer_ids,
    mha_layout,
    run_decoder_stack,
)
from eagletree.adapters.models.tensor_parallel import SINGLE, RowParallelLinear, TensorParallel
from eagletree.domain.attention_layer import AttentionLayer


class LlamaAttention(nn.Module):
    """GQA attention; ``input_size`` differs from hidden_size only in EAGLE-3's midlayer (2·H).

    q, k and v come from one GEMM (``qkv_proj``, filled from the checkpoint's q/k/v_proj). With
    ``fused_kernels`` and an MHA pool in the context, one kernel rotates q and k and stores k and
    v in the pool, and the backend runs with ``save_kv=False``.

    Tensor-parallel: a rank owns ``heads / W`` query heads and ``kv_heads / W`` kv heads (its
    KV pool holds only those), and ``o_proj`` sums the ranks' head outputs (one all-reduce).
    """

    def __init__(
        self,
        config: LlamaConfig,
        layer_id: int,
        input_size: int | None = None,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        heads, kv_heads, head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        width = config.hidden_size if input_size is None else input_size
        bias = config.attention_bias
        parts = (
            ("q_proj", heads * head_dim),
            ("k_proj", kv_heads * head_dim),
            ("v_proj", kv_heads * head_dim),
        )
        self.qkv_proj = MergedLinear(width, parts, bias=bias, tp=tp)
        self.o_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, bias=bias, tp=tp, fused_kernels=fused_kernels
        )
        self.fused_kernels = fused_kernels
        self.layer = AttentionLayer(
            layer_id=layer_id,
            num_q_heads=tp.split(heads, "num_attention_heads"),
            num_kv_heads=tp.split(kv_heads, "num_key_value_heads"),
            head_dim=head_dim,
            v_head_dim=head_dim,
            scaling=head_dim**-0.5,
        )

    def forward(self, x: torch.Tensor, rope: RopeTables, ctx: AttentionContext) -> torch.Tensor:
        # x: (num_tokens, width) -> (num_tokens, hidden)
        q, k, v = self._heads(x)
        buffers = mha_kv_buffers(ctx.kv_pool, self.layer.layer_id) if self.fused_kernels else None
        if buffers is not None and not rope.interleaved:
            o = self._attend_stored(q, k, v, rope, ctx, buffers)
        else:
            q, k = rope.rotate(q), rope.rotate(k)
            # o: (num_tokens, num_q_heads * head_dim)
            o = ctx.backend.forward(q, k, v, self.layer, ctx.batch)
        out: torch.Tensor = self.o_proj(o)
        return out

    def stream_buffers(
        self, num_tokens: int, rope: RopeTables, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The pool's K and V buffers ``on_stream`` stores into, or None where it cannot run
        (no fused RoPE store for this pool or layout, o_proj not streamed on one rank)."""
        if rope.interleaved or not self.o_proj.adds_residual(num_tokens):
            return None
        return mha_kv_buffers(ctx.kv_pool, self.layer.layer_id)

    def on_stream(
        self,
        stream: torch.Tensor,
        rope: RopeTables,
        ctx: AttentionContext,
        buffers: tuple[torch.Tensor, torch.Tensor],
        eps: float | None,
    ) -> torch.Tensor:
        """``stream + self(norm(stream))`` where the norm's weight is folded into ``qkv_proj``
        (``eps`` None: no norm, as on an EAGLE head's first layer): the RoPE kernel applies
        the norm's statistic to q, k and v, and o_proj's kernel adds the stream."""
        # stream: (num_tokens, hidden) -> (num_tokens, hidden)
        q, k, v = self._heads(stream)
        norm_of = None if eps is None else stream
        o = self._attend_stored(q, k, v, rope, ctx, buffers, norm_of, eps or 0.0)
        return self.o_proj.product(o, residual=stream)

    def _attend_stored(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables,
        ctx: AttentionContext,
        buffers: tuple[torch.Tensor, torch.Tensor],
        norm_of: torch.Tensor | None = None,
        eps: float = 0.0,
    ) -> torch.Tensor:
        # q (n, Hq, D), k, v (n, Hk, D) -> o (n, Hq·D): RoPE and the KV store in one kernel
        loc = ctx.batch.out_cache_loc
        q = rope_kv_store(q, k, v, rope.cos, rope.sin, loc, *buffers, norm_of, eps)
        # k, v are ignored with save_kv=False: the backend reads every key from the pool
        return ctx.backend.forward(q, k, v, self.layer, ctx.batch, save_kv=False)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: (num_tokens, width) -> q (n, Hq, D), k, v (n, Hk, D): strided views of one GEMM
        layer, num_tokens = self.layer, x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        return (
            q.view(num_tokens, layer.num_q_heads, layer.head_dim),
            k.view(num_tokens, layer.num_kv_heads, layer.head_dim),
            v.view(num_tokens, layer.num_kv_heads, layer.head_dim),
        )


class LlamaDecoderLayer(PreNormDecoderLayer):
    """Llama attention and SwiGLU as a ``PreNormDecoderLayer``.

    ``skip_input_norm``: EAGLE-1 heads have no input norm on their first layer (the fc output
    goes straight into attention), as SafeAILab's reference and SGLang do. ``dense``: the MLP
    is sharded over that data-parallel group instead of ``tp`` (``dense_layers``).
    """

    self_attn: LlamaAttention

    def __init__(
        self,
        config: LlamaConfig,
        layer_id: int,
        skip_input_norm: bool = False,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
        dense: DenseGroup | None = None,
    ) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = None if skip_input_norm else RMSNorm(hidden, eps, fused_kernels)
        self.self_attn = LlamaAttention(config, layer_id, fused_kernels=fused_kernels, tp=tp)
        self.post_attention_layernorm = RMSNorm(hidden, eps, fused_kernels)
        self.mlp = swiglu_over(
            hidden, config.intermediate_size, config.mlp_bias, fused_kernels, tp, dense
        )
        self.norms_folded = False

    def fold_norms(self) -> None:
        """Fold both norms' weights into q/k/v and gate/up (``fold_rms_weight``), so that a
        decode step's layer runs on the residual stream without a norm launch. Projections
        with a bias keep their norms (the statistic would scale the bias too)."""
        if self.self_attn.qkv_proj.bias is not None or self.mlp.gate_up_proj.bias is not None:
            return
        if self.input_layernorm is not None:
            fold_rms_weight(self.input_layernorm, self.self_attn.qkv_proj)
        fold_rms_weight(self.post_attention_layernorm, self.mlp.gate_up_proj)
        self.norms_folded = True

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        ctx: AttentionContext,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # h, residual: (num_tokens, hidden). Folded and streamed, the layer returns the stream
        # itself with no residual beside it, which the next layer reads as a first layer would.
        num_tokens = h.shape[0]
        folded = self.norms_folded and self.mlp.runs_on_stream(num_tokens)
        buffers = self.self_attn.stream_buffers(num_tokens, rope, ctx) if folded else None
        if buffers is None:
            return super().forward(h, residual, rope, ctx)
        stream = h if residual is None else residual + h
        eps = None if self.input_layernorm is None else self.input_layernorm.eps
        stream = self.self_attn.on_stream(stream, rope, ctx, buffers, eps)
        return self.mlp.on_stream(stream, self.post_attention_layernorm.eps), None


def fold_layer_norms(layers: nn.ModuleList) -> None:
    """Each Llama layer's norms folded into its projections (``LlamaDecoderLayer.fold_norms``)."""
    for layer in layers:
        if isinstance(layer, LlamaDecoderLayer):
            layer.fold_norms()


class LlamaForCausalLM(nn.Module):
    """Embedding, decoder layers, final norm and lm_head (tied to the embedding when configured).

    Tensor-parallel over ``tp``: embedding and lm_head by vocabulary (the logits are gathered,
    so every rank sees all of them), attention by heads, the MLP by intermediate features.
    With ``dense`` (data-parallel attention) the embedding, the MLPs and the lm_head are sharded
    over that group while attention stays whole on each rank (``tp`` is then the single rank)."""

    def __init__(
        self,
        config: LlamaConfig,
        aux_layer_ids: Sequence[int] = (),
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
        dense: DenseGroup | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        self.aux_layer_ids = check_aux_layer_ids(aux_layer_ids, config.num_hidden_layers)
        self.embed_tokens = embedding_over(config.vocab_size, config.hidden_size, tp, dense)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, fused_kernels=fused_kernels, tp=tp, dense=dense)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, fused_kernels)
        self.lm_head = lm_head_over(config.hidden_size, config.vocab_size, tp, fused_kernels, dense)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, fused_kernels=fused_kernels)
        self.tie_weights()

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def aux_hidden_size(self) -> int:
        return len(self.aux_layer_ids) * self.config.hidden_size

    @property
    def kv_layout(self) -> MHALayout:
        return mha_layout(self.config, self.config.num_hidden_layers, self.tp)

    def fold_norms(self) -> None:
        fold_layer_norms(self.layers)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext
    ) -> TargetHidden:
        return run_decoder_stack(
            self.embed_tokens,
            self.layers,
            self.norm,
            self.rotary,
            self.aux_layer_ids,
            input_ids,
            positions,
            ctx,
        )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, H) final-normed hidden states -> (rows, V) logits in the model's dtype."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits
