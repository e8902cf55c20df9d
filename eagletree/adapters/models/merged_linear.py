"""Adapter: one Linear for several projections of the same input (q/k/v, gate/up), one GEMM.

Checkpoints keep one tensor per projection under its Hugging Face name; ``checkpoint_parts``
names the row block of the merged weight (and bias) each of them fills, which is how loading and
the random-checkpoint writer see a merged module: as the separate projections it replaces.
Under tensor parallelism each part is column-parallel: a rank holds its row block of every
part, side by side (q, k, v of its own heads), and each view is filled from that rank's block
of the part's checkpoint tensor.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from eagletree.adapters.models.tensor_parallel import SINGLE, CheckpointShard, TensorParallel


class MergedLinear(nn.Linear):
    """``parts``: (checkpoint module name, output rows of the full model) in output order."""

    def __init__(
        self,
        in_features: int,
        parts: Sequence[tuple[str, int]],
        bias: bool,
        tp: TensorParallel = SINGLE,
    ) -> None:
        local = tuple((name, tp.split(rows, f"{name} output rows")) for name, rows in parts)
        super().__init__(in_features, sum(rows for _, rows in local), bias=bias)
        self.parts = local
        self.tp = tp

    @property
    def part_sizes(self) -> list[int]:
        return [rows for _, rows in self.parts]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This module's output (…, sum of rows) as one view per part (…, rows)."""
        return tuple(torch.split(y, self.part_sizes, dim=-1))

    def checkpoint_parts(self) -> Iterator[tuple[str, torch.Tensor, CheckpointShard | None]]:
        """(``{part}.weight`` / ``{part}.bias``, the view of the merged tensor it fills, the
        block of the checkpoint tensor that fills it (None: all of it))."""
        offset = 0
        shard = self.tp.shard(0)
        for name, rows in self.parts:
            yield f"{name}.weight", self.weight.narrow(0, offset, rows), shard
            if self.bias is not None:
                yield f"{name}.bias", self.bias.narrow(0, offset, rows), shard
            offset += rows
