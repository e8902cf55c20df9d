"""Adapter: one Linear for several projections of the same input (q/k/v, gate/up), one GEMM.

Checkpoints keep one tensor per projection under its Hugging Face name; ``checkpoint_parts``
names the row block of the merged weight (and bias) each of them fills, which is how loading and
the random-checkpoint writer see a merged module: as the separate projections it replaces.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """``parts``: (checkpoint module name, output rows) in output order, e.g. q, k, v."""

    def __init__(self, in_features: int, parts: Sequence[tuple[str, int]], bias: bool) -> None:
        super().__init__(in_features, sum(rows for _, rows in parts), bias=bias)
        self.parts = tuple(parts)

    @property
    def part_sizes(self) -> list[int]:
        return [rows for _, rows in self.parts]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This module's output (…, sum of rows) as one view per part (…, rows)."""
        return tuple(torch.split(y, self.part_sizes, dim=-1))

    def checkpoint_parts(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(``{part}.weight`` / ``{part}.bias``, the view of the merged tensor it fills)."""
        offset = 0
        for name, rows in self.parts:
            yield f"{name}.weight", self.weight.narrow(0, offset, rows)
            if self.bias is not None:
                yield f"{name}.bias", self.bias.narrow(0, offset, rows)
            offset += rows
