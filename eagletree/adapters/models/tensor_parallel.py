"""Adapter: tensor parallelism on torch.distributed — the group a model is sharded over and the
sharded layers (column-, row- and vocabulary-parallel).

A ``TensorParallel`` value names this process's rank, the group's size and the explicit process
group (``dist.new_group``, never the default group), and is passed to every model constructor;
with ``world_size == 1`` (``SINGLE``) every layer here is exactly its ``nn`` counterpart and no
collective runs. Sharded layers hold the rank's block of the full weight and say, per
parameter, which block of the checkpoint tensor fills it (``checkpoint_shard``), so that loading
reads each rank's slice straight from the same checkpoint files.

Collectives per decoder layer: one all-reduce after attention's ``o_proj`` and one after the
MLP's ``down_proj`` (row-parallel), one for the vocabulary-parallel embedding and one all-gather
of the lm_head's logits. The reduced result is the same on every rank (a collective returns one
value to all), so the replicated parts that follow compute the same bits everywhere.

Built with ``fused_kernels`` the column- and row-parallel layers multiply the few rows of a
decode step with the weight-stream kernel (``streamed_linear``: one pass over the weight, no
split-K reduction); larger inputs go to cuBLAS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from eagletree.adapters.models.streamed_linear import StreamedLinear
from eagletree.domain.errors import ConfigurationError


class CheckpointShard(NamedTuple):
    """Block ``block`` of ``num_blocks`` equal blocks along ``dim`` of a checkpoint tensor."""

    dim: int
    block: int
    num_blocks: int

    def local_shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        shape = list(full)
        shape[self.dim] //= self.num_blocks
        return tuple(shape)

    def divides(self, full: tuple[int, ...]) -> bool:
        return len(full) > self.dim and full[self.dim] % self.num_blocks == 0

    def slices(self, full: tuple[int, ...]) -> tuple[slice, ...]:
        """The index of this block in a tensor of shape ``full``."""
        size = full[self.dim] // self.num_blocks
        index = [slice(None)] * len(full)
        index[self.dim] = slice(self.block * size, (self.block + 1) * size)
        return tuple(index)


@runtime_checkable
class ShardedParameters(Protocol):
    """A module whose parameters are blocks of the checkpoint's tensors."""

    def checkpoint_shard(self, parameter: str) -> CheckpointShard | None: ...


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """This process's place in a tensor-parallel group; ``group`` None only for one rank."""

    rank: int = 0
    world_size: int = 1
    group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        if self.world_size > 1 and self.group is None:
            raise ValueError("a tensor-parallel group of several ranks needs its process group")

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def split(self, size: int, what: str) -> int:
        """This rank's share of ``size`` (heads, rows, vocabulary entries): size / world_size."""
        if size % self.world_size:
            raise ConfigurationError(
                f"{what} = {size} is not divisible by the tensor-parallel size"
                f" {self.world_size}: choose a parallel.tp_size that divides it"
            )
        return size // self.world_size

    def shard(self, dim: int) -> CheckpointShard | None:
        """This rank's block along ``dim``; None without parallelism (the whole tensor)."""
        return CheckpointShard(dim, self.rank, self.world_size) if self.is_parallel else None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the group, in place; ``x`` itself for one rank."""
        if self.is_parallel:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """(…, n) per rank -> (…, world_size · n): every rank's block in rank order."""
        if not self.is_parallel:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()


class ColumnParallelLinear(StreamedLinear):
    """``nn.Linear(in, out)`` holding output rows ``rank·out/W .. (rank+1)·out/W``; each rank's
    output is its block of the full output, or the full output with ``gather_output``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel = SINGLE,
        *,
        gather_output: bool = False,
        what: str = "output features",
        fused_kernels: bool = False,
    ) -> None:
        super().__init__(in_features, tp.split(out_features, what), bias, fused_kernels)
        self.tp = tp
        self.gather_output = gather_output

    def checkpoint_shard(self, parameter: str) -> CheckpointShard | None:
        return self.tp.shard(0)  # weight (out, in) and bias (out,): rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, in) -> (num_tokens, out / W), or (num_tokens, out) gathered
        y = self.product(x)
        return self.tp.all_gather_last(y) if self.gather_output else y


def gathered_lm_head(
    hidden_size: int, vocab_size: int, tp: TensorParallel, fused_kernels: bool
) -> ColumnParallelLinear:
    """A target's lm_head: vocabulary rows per rank, the logits gathered (tied or not)."""
    return ColumnParallelLinear(
        hidden_size,
        vocab_size,
        False,
        tp,
        gather_output=True,
        what="vocab_size",
        fused_kernels=fused_kernels,
    )


class RowParallelLinear(StreamedLinear):
    """``nn.Linear(in, out)`` holding input columns ``rank·in/W .. (rank+1)·in/W``: each rank
    multiplies its block of the input (a column-parallel layer's output), the partial products
    are summed across the group, and the (replicated) bias is added once after the sum."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel = SINGLE,
        *,
        what: str = "input features",
        fused_kernels: bool = False,
    ) -> None:
        super().__init__(tp.split(in_features, what), out_features, bias, fused_kernels)
        self.tp = tp

    def checkpoint_shard(self, parameter: str) -> CheckpointShard | None:
        return self.tp.shard(1) if parameter == "weight" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, in / W) -> (num_tokens, out), the same on every rank
        if not self.tp.is_parallel:
            return self.product(x)
        y = self.tp.all_reduce(self.product(x, with_bias=False))
        return y if self.bias is None else y + self.bias


# up to this many ids CUDA's index_select runs its small-index kernel, serial over the ids
FEW_ROWS = 16


class VocabParallelEmbedding(nn.Embedding):
    """``nn.Embedding(V, H)`` holding rows ``rank·V/W .. (rank+1)·V/W``: a rank looks up the
    ids in its block, zeros the others, and the sum over the group is the full lookup (exact:
    every row but one adds zeros). Its weight may be tied to a gathered ``ColumnParallelLinear``
    lm_head, whose row blocks are the same."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TensorParallel = SINGLE):
        super().__init__(tp.split(num_embeddings, "vocab_size"), embedding_dim)
        self.tp = tp
        self.vocab_start = tp.rank * self.num_embeddings

    def checkpoint_shard(self, parameter: str) -> CheckpointShard | None:
        return self.tp.shard(0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: (num_tokens,) -> (num_tokens, H)
        if not self.tp.is_parallel:
            return self._rows(input_ids)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        rows = self._rows(local.masked_fill(outside, 0))
        return self.tp.all_reduce(rows.masked_fill(outside.unsqueeze(-1), 0.0))

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``ids`` (all within its block)."""
        if 1 < ids.numel() <= FEW_ROWS:
            # a draft depth's few tokens: CUDA's small-index kernel behind nn.Embedding's
            # index_select walks the ids one after another in every thread, where an advanced
            # index copies them all at once (H100, 768 wide: 8 rows 7.7 µs against 3.3, 16 rows
            # 12.5 against 3.4; one row 3.1 against 4.8, so a lone id stays with index_select;
            # benchmarks/row_gather.py)
            return self.weight[ids]
        return super().forward(ids)
