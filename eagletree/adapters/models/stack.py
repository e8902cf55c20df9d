"""Adapter: what every decoder-only target shares — its parts around the layers, the layer loop
and the hidden-state capture."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import nn

from eagletree.adapters.models.config import LlamaConfig
from eagletree.adapters.models.dense_layers import embedding_over, lm_head_over
from eagletree.adapters.models.layers import (
    AttentionContext,
    PreNormDecoderLayer,
    RMSNorm,
    rms_norm,
)
from eagletree.adapters.models.rotary import RotaryEmbedding
from eagletree.adapters.models.tensor_parallel import TensorParallel

if TYPE_CHECKING:
    from eagletree.adapters.models.config import MLAConfig
    from eagletree.adapters.models.dense_group import DenseGroup


class MHALayout(NamedTuple):
    """What an ``MHAKVPool`` for a model must look like. ``direct_writes``: the model's layers
    write their new K and V rows into the pool's buffers themselves (built with fused kernels),
    so the buffers must be ones the kernel writes — not fp8, indexed by slot (no translation)."""

    layer_num: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    direct_writes: bool = False


class MLALayout(NamedTuple):
    """What an ``MLAKVPool`` for a model must look like. A model built with fused kernels
    writes the rows of ``get_kv_buffer`` itself, which every MLA-family pool's buffer takes."""

    layer_num: int
    kv_lora_rank: int
    qk_rope_head_dim: int


KVLayout = MHALayout | MLALayout


def mha_layout(
    config: LlamaConfig, layer_num: int, tp: TensorParallel, direct_writes: bool
) -> MHALayout:
    """The pool of ``layer_num`` GQA layers of ``config``: this rank's kv heads only."""
    kv_heads = tp.split(config.num_key_value_heads, "num_key_value_heads")
    return MHALayout(layer_num, kv_heads, config.head_dim, config.head_dim, direct_writes)


class TargetHidden(NamedTuple):
    """What a target's layers produce for the runner.

    ``hidden``: (num_tokens, H) the final norm's output, i.e. the lm_head input — the feature
    EAGLE-1 heads and MTP layers were trained on. ``aux``: (num_tokens, n·H) the inputs of the
    capture layers, concatenated in the configured order (EAGLE-3), or None.
    """

    hidden: torch.Tensor
    aux: torch.Tensor | None


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's capture layers: the inputs of layers 2, L/2 and L−3 (SafeAILab, SGLang)."""
    return (2, num_layers // 2, num_layers - 3)


def check_aux_layer_ids(aux_layer_ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """The ids as a tuple; each is a layer whose input is captured (``num_layers``: the output)."""
    ids = tuple(aux_layer_ids)
    bad = [i for i in ids if not 0 <= i <= num_layers]
    if bad:
        raise ValueError(
            f"aux hidden-state layers {bad} are outside 0..{num_layers} for a {num_layers}-layer"
            f" target (layer i means the input of layer i; {num_layers} the last layer's output)"
        )
    return ids


def run_decoder_stack(
    embed_tokens: nn.Embedding,
    layers: nn.ModuleList,
    norm: RMSNorm,
    rotary: RotaryEmbedding,
    aux_layer_ids: tuple[int, ...],
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    ctx: AttentionContext,
) -> TargetHidden:
    # input_ids, positions: (num_tokens,); each layer: (h, residual) -> (its output, residual),
    # the stream between layers being residual + h, or h alone after a stream layer (which
    # returns no residual: StreamLlamaDecoderLayer)
    h = embed_tokens(input_ids)
    rope = rotary(positions, h.dtype)
    residual: torch.Tensor | None = None
    # the captured streams are written into their columns of one (num_tokens, n·H) tensor as
    # they pass, each by the kernel that computes it (``forward_copying``: a stream layer's
    # down_proj for the stream leaving it, an input norm's add for the stream entering a
    # pre-norm layer, the final norm's for the last), a copy where none does
    aux = h.new_empty(h.shape[0], len(aux_layer_ids) * h.shape[-1]) if aux_layer_ids else None
    columns: dict[int, list[torch.Tensor]] = {}
    if aux is not None:
        for k, column in enumerate(aux.chunk(len(aux_layer_ids), dim=-1)):
            columns.setdefault(aux_layer_ids[k], []).append(column)
    written: torch.Tensor | None = None  # the column the layer before stored
    for i, module in enumerate(layers):
        layer = cast(PreNormDecoderLayer, module)  # every target's layers derive from it
        entering = [column for column in columns.get(i, ()) if column is not written]
        leaving = columns.get(i + 1, [None])[0]
        input_to = entering[0] if entering else None
        h, residual, wrote = layer.forward_copying(h, residual, rope, ctx, input_to, leaving)
        for column in entering[1:]:  # a layer captured twice
            column.copy_(entering[0])
        written = leaving if wrote else None
    last = [column for column in columns.get(len(layers), ()) if column is not written]
    output_to = last[0] if last else None
    if residual is None:  # no layers, or a stream layer's output: the stream itself
        normed, stream = norm(h), h
        if output_to is not None:
            output_to.copy_(stream)
    else:
        normed, stream = norm.add(h, residual, copy_to=output_to)
    for column in last[1:]:
        column.copy_(stream)
    return TargetHidden(normed, aux)


class DecoderOnlyLM(nn.Module):
    """A decoder-only target: the embedding, the layers ``layer`` builds by index, the final
    norm, ``rotary`` and the lm_head (tied to the embedding when the config says so).

    Tensor-parallel over ``tp``: embedding and lm_head by vocabulary (the logits are gathered,
    so every rank sees all of them), the layers as they split themselves. With ``dense``
    (data-parallel attention) the embedding and the lm_head are sharded over that group."""

    def __init__(
        self,
        config: LlamaConfig | MLAConfig,
        aux_layer_ids: Sequence[int],
        fused_kernels: bool,
        tp: TensorParallel,
        dense: DenseGroup | None,
        layer: Callable[[int], PreNormDecoderLayer],
        rotary: RotaryEmbedding,
    ) -> None:
        super().__init__()
        self.config = config
        self.vocab_size, self.hidden_size = config.vocab_size, config.hidden_size
        self.tp = tp
        self.aux_layer_ids = check_aux_layer_ids(aux_layer_ids, config.num_hidden_layers)
        self.embed_tokens = embedding_over(config.vocab_size, config.hidden_size, tp, dense)
        self.layers = nn.ModuleList(layer(i) for i in range(config.num_hidden_layers))
        self.norm = rms_norm(config.hidden_size, config.rms_norm_eps, fused_kernels)
        self.lm_head = lm_head_over(config.hidden_size, config.vocab_size, tp, fused_kernels, dense)
        self.rotary = rotary
        self.tie_weights()

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
