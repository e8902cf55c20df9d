"""Adapter: the Llama-architecture target (HF ``LlamaForCausalLM``) with attention through the port,
and its decoder layers — the pre-norm layer, and the stream layer its norms fold into.

Module and parameter names are those of the HF checkpoint without the ``model.`` prefix, so that
loading is a rename and a shape check. Each layer's blocks are built for the model's
``fused_kernels``; ``fold_norms`` (the loaders call it with fused kernels) replaces each layer by
the one that runs its folded weights. Nothing chooses a path per call but the stream layer's
row rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from eagletree.adapters.kernels.triton.skinny_gemm import MAX_ROWS
from eagletree.adapters.models.config import LlamaConfig
from eagletree.adapters.models.dense_group import DenseGroup
from eagletree.adapters.models.dense_layers import swiglu_over
from eagletree.adapters.models.layers import (
    AttentionContext,
    PreNormDecoderLayer,
    RMSNorm,
    SwiGLU,
    fold_rms_weight,
    rms_norm,
)
from eagletree.adapters.models.llama_attention import (
    FusedLlamaAttention,
    LlamaAttention,
    llama_attention,
)
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding
from eagletree.adapters.models.stack import (
    DecoderOnlyLM,
    mha_layout,
)
from eagletree.adapters.models.tensor_parallel import SINGLE, TensorParallel


class LlamaDecoderLayer(PreNormDecoderLayer):
    """Llama attention and SwiGLU as a ``PreNormDecoderLayer`` (``llama_decoder_layer`` builds
    one for a config). ``norms_folded``: both norms' weights live in q/k/v and gate/up
    (``folded``) and the norms have unit weights."""

    self_attn: LlamaAttention

    def __init__(
        self,
        input_layernorm: RMSNorm | None,
        self_attn: LlamaAttention,
        post_attention_layernorm: RMSNorm,
        mlp: SwiGLU,
        norms_folded: bool = False,
    ) -> None:
        super().__init__(input_layernorm, self_attn, post_attention_layernorm, mlp)
        self.norms_folded = norms_folded

    def folded(self) -> LlamaDecoderLayer:
        """The layer to run in this one's place once both norms' weights are folded into q/k/v
        and gate/up (``fold_rms_weight``, in place): a ``StreamLlamaDecoderLayer`` where its
        kernels can run on the stream (fused, on one rank), else a pre-norm layer with
        unit-weight norms. Projections with a bias keep their norms (the statistic would scale
        the bias too): this layer, unchanged."""
        norm_in, attn = self.input_layernorm, self.self_attn
        norm_post, mlp = self.post_attention_layernorm, self.mlp
        if self.norms_folded or attn.qkv_proj.bias is not None or mlp.gate_up_proj.bias is not None:
            return self
        if norm_in is not None:
            fold_rms_weight(norm_in, attn.qkv_proj)
        fold_rms_weight(norm_post, mlp.gate_up_proj)
        one_rank = not (attn.o_proj.tp.is_parallel or mlp.down_proj.tp.is_parallel)
        if isinstance(attn, FusedLlamaAttention) and one_rank:
            return StreamLlamaDecoderLayer(norm_in, attn, norm_post, mlp)
        return LlamaDecoderLayer(norm_in, attn, norm_post, mlp, norms_folded=True)


class StreamLlamaDecoderLayer(LlamaDecoderLayer):
    """A folded layer with fused kernels on one rank, which runs a decode step's rows on the
    residual stream itself: q/k/v = stream · W′ᵀ, the RoPE store scales them by the input
    norm's statistic, o_proj's weight-stream kernel adds the stream; the same for gate/up,
    SiLU-and-mul and down_proj. No norm kernel runs. It returns ``(stream, None)``, which the
    next layer reads as a first layer's input.

    The one rule it applies per call is the weight-stream kernel's: more than ``MAX_ROWS`` rows
    go to cuBLAS, which cannot add the residual, so such a forward (a prefill) runs the
    pre-norm layer, its norms' unit weights leaving the folded projections right."""

    self_attn: FusedLlamaAttention

    def __init__(
        self,
        input_layernorm: RMSNorm | None,
        self_attn: FusedLlamaAttention,
        post_attention_layernorm: RMSNorm,
        mlp: SwiGLU,
    ) -> None:
        super().__init__(input_layernorm, self_attn, post_attention_layernorm, mlp, True)
        # None: no input norm (an EAGLE head's first layer), so no statistic to apply
        self.input_eps = None if input_layernorm is None else input_layernorm.eps

    def forward_copying(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        ctx: AttentionContext,
        input_to: torch.Tensor | None,
        output_to: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        # h, residual: (num_tokens, hidden) -> (stream, None, …), or the pre-norm pair. On the
        # stream, down_proj's kernel produces the stream leaving the layer and stores it into
        # output_to as well; the stream entering it is a copy (no kernel here makes it)
        if h.shape[0] > MAX_ROWS:
            return super().forward_copying(h, residual, rope, ctx, input_to, output_to)
        stream = h if residual is None else residual + h
        if input_to is not None:
            input_to.copy_(stream)
        stream = self.self_attn.on_stream(stream, rope, ctx, self.input_eps)
        eps = self.post_attention_layernorm.eps
        return self.mlp.on_stream(stream, eps, output_to), None, output_to is not None


def llama_decoder_layer(
    config: LlamaConfig,
    layer_id: int,
    skip_input_norm: bool = False,
    fused_kernels: bool = False,
    tp: TensorParallel = SINGLE,
    dense: DenseGroup | None = None,
) -> LlamaDecoderLayer:
    """A Llama layer of ``config``, with the Triton kernels' blocks or the torch reference's.

    ``skip_input_norm``: EAGLE-1 heads have no input norm on their first layer (the fc output
    goes straight into attention), as SafeAILab's reference and SGLang do. ``dense``: the MLP
    is sharded over that data-parallel group instead of ``tp`` (``dense_layers``).
    """
    hidden, eps, mlp_size = config.hidden_size, config.rms_norm_eps, config.intermediate_size
    return LlamaDecoderLayer(
        None if skip_input_norm else rms_norm(hidden, eps, fused_kernels),
        llama_attention(config, layer_id, fused_kernels=fused_kernels, tp=tp),
        rms_norm(hidden, eps, fused_kernels),
        swiglu_over(hidden, mlp_size, config.mlp_bias, fused_kernels, tp, dense),
    )


def fold_layer_norms(layers: nn.ModuleList) -> None:
    """Each Llama layer replaced by its ``folded`` self."""
    for i, layer in enumerate(layers):
        if isinstance(layer, LlamaDecoderLayer):
            layers[i] = layer.folded()


class LlamaForCausalLM(DecoderOnlyLM):
    """Llama decoder layers in a ``DecoderOnlyLM``: tensor-parallel attention by heads and the
    MLP by intermediate features; with ``dense`` (data-parallel attention) the MLPs are sharded
    over that group while attention stays whole on each rank (``tp`` is then the single rank)."""

    config: LlamaConfig

    def __init__(
        self,
        config: LlamaConfig,
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
            layer=lambda i: llama_decoder_layer(
                config, i, fused_kernels=fused_kernels, tp=tp, dense=dense
            ),
            rotary=RotaryEmbedding(config.rope, config.head_dim, fused_kernels=fused_kernels),
        )
        self.kv_layout = mha_layout(config, config.num_hidden_layers, tp, fused_kernels)

    def fold_norms(self) -> None:
        """Each layer's norms folded into its projections (``LlamaDecoderLayer.folded``): with
        fused kernels a decode step then runs no norm kernel before the final norm."""
        fold_layer_norms(self.layers)
