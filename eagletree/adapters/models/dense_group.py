"""Adapter: the data-parallel group a model's dense layers are sharded over — every rank's token
rows gathered, padded to the group's largest count, and each rank's own rows kept.

Under data-parallel attention each rank runs attention over its own requests, but the MLP,
the embedding and the lm_head hold only 1/W of their weight (``DenseGroup.tp``, a
``TensorParallel`` value over the data-parallel ranks). Such a layer needs every rank's rows:
it all-gathers them, each rank padded to the group's largest row count so that the gather has
one shape, runs its shard over the W · padded rows, reduces across the group (the shard's own
all-reduce or all-gather) and keeps the block of rows that is this rank's.

The row counts are host integers (a tensor's shape), exchanged by one small all-reduce over
the host (gloo) group: the embedding exchanges them at the start of a forward and the decoder
layers' MLPs reuse that exchange (``start_forward`` / ``forward_rows``); the lm_head, which
sees only the rows whose logits are wanted, exchanges its own. Every rank must therefore run
the same forwards in the same order, a rank without rows for one running it with zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from eagletree.adapters.models.tensor_parallel import TensorParallel


class RowCounts(NamedTuple):
    """Every rank's row count of one forward (by rank) and which of them is this rank."""

    counts: tuple[int, ...]
    rank: int

    @property
    def padded(self) -> int:
        """The rows each rank contributes to a gather: the group's largest count."""
        return max(self.counts)

    @property
    def own(self) -> int:
        return self.counts[self.rank]


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` (n, …) followed by zero rows up to (rows, …)."""
    if x.shape[0] == rows:
        return x
    padded = x.new_zeros((rows, *x.shape[1:]))
    padded[: x.shape[0]] = x
    return padded


def gather_padded(
    x: torch.Tensor,
    counts: RowCounts,
    all_gather: Callable[[torch.Tensor], list[torch.Tensor]],
) -> torch.Tensor:
    """(own, …) on each rank -> (W · padded, …): rank r's rows at ``r · padded ..
    r · padded + counts[r]``, zeros after them. ``all_gather`` returns every rank's tensor of
    the same shape, by rank."""
    assert x.shape[0] == counts.own, f"{x.shape[0]} rows, but this rank's count is {counts.own}"
    if counts.padded == 0:  # every rank has nothing: no collective, the empty rows as they are
        return x
    return torch.cat(all_gather(pad_rows(x, counts.padded).contiguous()))


def own_rows(y: torch.Tensor, counts: RowCounts) -> torch.Tensor:
    """This rank's block of a result over gathered rows: (W · padded, …) -> (own, …)."""
    return y.narrow(0, counts.rank * counts.padded, counts.own)


class DenseGroup:
    """The group the dense layers are sharded over: ``tp`` (rank, size and the device-backend
    group of the weights' collectives) and ``count_group``, the host (gloo) group over the same
    ranks that exchanges the row counts. Shared by a target and the drafts that borrow its
    embedding and lm_head; it keeps the counts of the forward in progress."""

    def __init__(self, tp: TensorParallel, count_group: dist.ProcessGroup | None) -> None:
        if tp.is_parallel and count_group is None:
            raise ValueError("a dense group of several ranks needs its host group for the counts")
        self.tp = tp
        self._count_group = count_group
        self._forward: RowCounts | None = None

    @property
    def size(self) -> int:
        return self.tp.world_size

    def exchange(self, num_rows: int) -> RowCounts:
        """Every rank's ``num_rows``, by rank (one all-reduce of W host integers)."""
        if not self.tp.is_parallel:
            return RowCounts((num_rows,), 0)
        slots = torch.zeros(self.tp.world_size, dtype=torch.int64)
        slots[self.tp.rank] = num_rows
        # SYNC: a host exchange with every rank (gloo, no device wait): the gather's padding
        # needs the group's largest row count, which differs per forward
        dist.all_reduce(slots, group=self._count_group)
        return RowCounts(tuple(int(n) for n in slots.tolist()), self.tp.rank)

    def start_forward(self, num_rows: int) -> RowCounts:
        """Exchange the counts of a forward's token rows, kept for its layers (``forward_rows``)."""
        self._forward = self.exchange(num_rows)
        return self._forward

    def forward_rows(self, num_rows: int) -> RowCounts:
        """The counts of the forward in progress, which has ``num_rows`` rows on this rank."""
        counts = self._forward
        if counts is None or counts.own != num_rows:
            raise RuntimeError(
                f"a dense layer got {num_rows} rows, but the forward in progress started with "
                f"{None if counts is None else counts.own}: its embedding must run first"
            )
        return counts

    def gather(self, x: torch.Tensor, counts: RowCounts) -> torch.Tensor:
        """``gather_padded`` over the group's device backend."""
        return gather_padded(x, counts, self._all_gather)

    def _all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self.tp.is_parallel:
            return [x]
        parts = [torch.empty_like(x) for _ in range(self.tp.world_size)]
        dist.all_gather(parts, x, group=self.tp.group)
        return parts
