"""Adapter: the MLP, embedding and lm_head sharded over a data-parallel ``DenseGroup``.

Each layer is its tensor-parallel counterpart over the group's ranks (the same parameters,
names and checkpoint blocks, so loading reads each rank's block as under tensor parallelism)
whose forward wraps the shard in the group's row exchange: gather every rank's rows (padded
to the group's largest count), run the shard over all of them — its own collective makes the
result whole on every rank — and keep this rank's rows. With no group (None) the factories
return the plain layers, so a model's constructor names one call per layer either way.
"""

from __future__ import annotations

import torch

from eagletree.adapters.models.dense_group import DenseGroup, own_rows
from eagletree.adapters.models.layers import SwiGLU
from eagletree.adapters.models.tensor_parallel import (
    ColumnParallelLinear,
    TensorParallel,
    VocabParallelEmbedding,
    gathered_lm_head,
)


class DenseSwiGLU(SwiGLU):
    """A decoder layer's MLP holding ``intermediate / W`` features of the group's ``W`` ranks;
    it uses the row counts its forward's embedding exchanged."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        fused_kernels: bool,
        group: DenseGroup,
    ) -> None:
        super().__init__(hidden_size, intermediate_size, bias, fused_kernels, group.tp)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (own, H) -> gathered (W · padded, H) -> summed over the group -> (own, H)
        counts = self.group.forward_rows(x.shape[0])
        return own_rows(super().forward(self.group.gather(x, counts)), counts)


class DenseEmbedding(VocabParallelEmbedding):
    """The embedding holding ``V / W`` vocabulary rows; it starts each forward's row exchange."""

    def __init__(self, num_embeddings: int, embedding_dim: int, group: DenseGroup) -> None:
        super().__init__(num_embeddings, embedding_dim, group.tp)
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: (own,) -> gathered (W · padded,) -> (W · padded, H) summed -> (own, H)
        counts = self.group.start_forward(input_ids.shape[0])
        return own_rows(super().forward(self.group.gather(input_ids, counts)), counts)


class DenseLmHead(ColumnParallelLinear):
    """The lm_head holding ``V / W`` vocabulary rows (tied: the embedding's block); its input
    rows are the forward's logits rows, so it exchanges their counts itself."""

    def __init__(
        self, hidden_size: int, vocab_size: int, fused_kernels: bool, group: DenseGroup
    ) -> None:
        super().__init__(
            hidden_size,
            vocab_size,
            False,
            group.tp,
            gather_output=True,
            what="vocab_size",
            fused_kernels=fused_kernels,
        )
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (own, H) -> gathered (W · padded, H) -> logits gathered (W · padded, V) -> (own, V)
        counts = self.group.exchange(x.shape[0])
        return own_rows(super().forward(self.group.gather(x, counts)), counts)


def swiglu_over(
    hidden_size: int,
    intermediate_size: int,
    bias: bool,
    fused_kernels: bool,
    tp: TensorParallel,
    dense: DenseGroup | None,
) -> SwiGLU:
    """The MLP: sharded over ``tp``, or over ``dense`` (then ``tp`` is the single rank)."""
    if dense is None:
        return SwiGLU(hidden_size, intermediate_size, bias, fused_kernels, tp)
    return DenseSwiGLU(hidden_size, intermediate_size, bias, fused_kernels, dense)


def embedding_over(
    vocab_size: int, hidden_size: int, tp: TensorParallel, dense: DenseGroup | None
) -> VocabParallelEmbedding:
    """The target's embedding: by vocabulary over ``tp``, or over ``dense``."""
    if dense is None:
        return VocabParallelEmbedding(vocab_size, hidden_size, tp)
    return DenseEmbedding(vocab_size, hidden_size, dense)


def lm_head_over(
    hidden_size: int,
    vocab_size: int,
    tp: TensorParallel,
    fused_kernels: bool,
    dense: DenseGroup | None,
) -> ColumnParallelLinear:
    """The target's lm_head: by vocabulary over ``tp`` (logits gathered), or over ``dense``."""
    if dense is None:
        return gathered_lm_head(hidden_size, vocab_size, tp, fused_kernels)
    return DenseLmHead(hidden_size, vocab_size, fused_kernels, dense)
