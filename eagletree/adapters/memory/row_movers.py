"""Adapter: RowMovers — per-buffer torch gather/scatter, and the one-launch Triton move."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import torch

from eagletree.adapters.kernels.triton import kv_move
from eagletree.adapters.kernels.triton.kv_move_table import (
    MIN_PROGRAMS,
    Launch,
    RowTable,
    Tuning,
    build_row_table,
    segment_launch,
)
from eagletree.adapters.memory.pool_rows import as_raw_words


def check_independent_groups(tgt: torch.Tensor, src: torch.Tensor, group_size: int) -> None:
    """Raises ``ValueError`` unless every hazard of the move stays inside one group.

    Group g is pairs ``[g·group_size, (g+1)·group_size)``. A hazard is a pair that reads a slot
    another moving pair (tgt != src) writes. Reads the answer back: a host sync.
    """
    # tgt, src: (num_moves,) integer slot ids, distinct targets
    if group_size < 1:
        raise ValueError(f"independent_groups must be >= 1, got {group_size}")
    num_moves = tgt.numel()
    if num_moves == 0:
        return
    tgt_index, src_index = tgt.long(), src.long()
    moving = tgt_index != src_index
    group = torch.arange(num_moves, device=tgt.device) // group_size
    num_slots = int(torch.maximum(tgt_index.max(), src_index.max())) + 1  # SYNC: check only
    writer_group = torch.full((num_slots,), -1, dtype=torch.int64, device=tgt.device)
    writer_group[tgt_index[moving]] = group[moving]
    read_group = writer_group[src_index]
    crossing = moving & (read_group >= 0) & (read_group != group)
    if bool(crossing.any()):  # SYNC: check only
        i = int(crossing.nonzero()[0, 0])  # SYNC: error message
        slot, own, other = int(src_index[i]), int(group[i]), int(read_group[i])
        raise ValueError(
            f"independent_groups={group_size} is wrong: pair {i} (group {own}) reads slot {slot},"
            f" which a pair of group {other} writes"
        )


def gather_scatter(buffers: Sequence[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
    """Per buffer, every source row into a temporary, then into the targets: two kernels each,
    on same-size integer views (bit-exact, and fp8 has no index kernels on CPU)."""
    # buffers: each (num_slots, *row_shape); tgt, src: (num_moves,) integer slot ids
    tgt_index, src_index = tgt.long(), src.long()
    for buf in buffers:
        words = as_raw_words(buf)
        words.index_copy_(0, tgt_index, words.index_select(0, src_index))


class TorchRowMover:
    """``gather_scatter``: two kernels per buffer, so launch-bound on small moves.

    ``independent_groups`` is checked (on CPU always, on CUDA with ``debug_checks``), then unused.
    """

    def __init__(self, debug_checks: bool = False) -> None:
        self._debug_checks = debug_checks

    def move(
        self,
        buffers: Sequence[torch.Tensor],
        tgt: torch.Tensor,
        src: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        if tgt.numel() == 0:
            return
        if independent_groups is not None and (tgt.device.type == "cpu" or self._debug_checks):
            check_independent_groups(tgt, src, independent_groups)
        gather_scatter(buffers, tgt, src)


class _Prepared(NamedTuple):
    table: RowTable
    owner: Sequence[torch.Tensor]  # the keyed sequence; holding it keeps every keyed id unique
    launches: dict[tuple[int, int | None], Launch]  # by (pairs, independent_groups)


_MAX_LAUNCHES = 4096  # cached launch shapes per buffer sequence (one per distinct pair count)


class TritonRowMover:
    """Moves every buffer in one Triton launch when one program can stage a whole group.

    * ``independent_groups=G`` (a promise that every hazard — a pair reading a slot another
      moving pair writes — stays inside its group of G consecutive pairs; the workers' compaction
      plans keep it with G = S+1): programs own whole groups, one launch at any pair count.
      Checked on CPU always, on CUDA only with ``debug_checks`` (the check synchronises); a wrong
      promise on CUDA without it corrupts rows.
    * Without the hint the whole move is one group: one launch up to ``max_staged_moves`` pairs.
    * A larger group goes through ``gather_scatter`` (two kernels per buffer); no engine path
      makes one.

    The other arguments shape launches (``kv_move_table.Tuning``). The device table of each
    buffer sequence is built once and cached (``max_cached`` most recent, kept alive): pass the
    same tuple every time, as the pools do; so is each pair count's launch shape, so a repeated
    move costs two dictionary lookups and one launch on the host.
    """

    def __init__(
        self,
        max_staged_moves: int = 512,
        register_words: int = 8192,
        group_lanes: int = 32,
        tile_words: int | None = None,
        num_warps: int | None = None,
        min_programs: int = MIN_PROGRAMS,
        debug_checks: bool = False,
        max_cached: int = 8,
    ) -> None:
        if group_lanes < 1 or group_lanes & (group_lanes - 1) or group_lanes > register_words:
            raise ValueError(f"group_lanes must be a power of two <= register_words: {group_lanes}")
        if not 1 <= max_staged_moves <= register_words:
            raise ValueError(f"need 1 <= max_staged_moves <= register_words ({register_words})")
        self._tuning = Tuning(
            max_staged_moves, group_lanes, register_words, tile_words, num_warps, min_programs
        )
        self._debug_checks = debug_checks
        self._max_cached = max_cached
        self._prepared: OrderedDict[tuple[int, ...], _Prepared] = OrderedDict()

    def move(
        self,
        buffers: Sequence[torch.Tensor],
        tgt: torch.Tensor,
        src: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        # buffers: each (num_slots, *row_shape), rows contiguous; tgt, src: (num_moves,) slot ids
        num_moves = tgt.numel()
        if num_moves == 0 or len(buffers) == 0:
            return
        on_cpu = tgt.device.type == "cpu"
        if on_cpu and not kv_move.can_run_on(tgt.device):
            raise RuntimeError("TritonRowMover on CPU tensors needs TRITON_INTERPRET=1 at import")
        if independent_groups is not None and (on_cpu or self._debug_checks):
            check_independent_groups(tgt, src, independent_groups)
        prepared = self._prepare(buffers)
        launch = prepared.launches.get((num_moves, independent_groups))
        if launch is None:
            launch = segment_launch(prepared.table, num_moves, independent_groups, self._tuning)
            if launch is None:
                gather_scatter(buffers, tgt, src)
                return
            if len(prepared.launches) >= _MAX_LAUNCHES:
                prepared.launches.clear()
            prepared.launches[(num_moves, independent_groups)] = launch
        kv_move.move_rows(prepared.table, tgt.contiguous(), src.contiguous(), launch)

    def _prepare(self, buffers: Sequence[torch.Tensor]) -> _Prepared:
        # A tuple is immutable, so its identity names its contents; other sequences by element.
        key = (id(buffers),) if isinstance(buffers, tuple) else tuple(map(id, buffers))
        prepared = self._prepared.get(key)
        if prepared is not None:
            self._prepared.move_to_end(key)
            return prepared
        prepared = _Prepared(build_row_table(tuple(buffers)), buffers, {})
        self._prepared[key] = prepared
        while len(self._prepared) > self._max_cached:
            self._prepared.popitem(last=False)
        return prepared
