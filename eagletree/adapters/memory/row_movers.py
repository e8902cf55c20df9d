"""Adapter: RowMovers — per-buffer torch gather/scatter and the one-launch Triton move."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import torch

from eagletree.adapters.kernels.triton import kv_move, kv_move_plan, kv_move_scratch, kv_move_table
from eagletree.adapters.memory.raw_words import as_raw_words


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


class TorchRowMover:
    """Gathers the source rows into a temporary, then scatters them: two kernels per buffer.

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
        # buffers: each (num_slots, *row_shape); tgt, src: (num_moves,) integer slot ids
        if tgt.numel() == 0:
            return
        if independent_groups is not None and (tgt.device.type == "cpu" or self._debug_checks):
            check_independent_groups(tgt, src, independent_groups)
        tgt_index, src_index = tgt.long(), src.long()
        for buf in buffers:
            words = as_raw_words(buf)
            words.index_copy_(0, tgt_index, words.index_select(0, src_index))


class _Launch(NamedTuple):
    """How a move of some pair count (and hint) runs: derived once, then looked up per call."""

    pairs_per_segment: int  # fixed segments of this many pairs; 0: the device segment plan
    num_segments: int
    shape: kv_move_table.TileShape


class _PreparedBuffers(NamedTuple):
    table: kv_move_table.RowTable
    mark: torch.Tensor  # (max_rows,) int32: which pair writes each slot (plan scratch)
    flag: torch.Tensor  # (1,) int32: 1 when the segment plan failed and the fallback moves
    owner: Sequence[torch.Tensor]  # the keyed sequence; holding it keeps every keyed id unique
    launches: dict[tuple[int, int | None], _Launch]  # by (pairs, independent_groups)


_MAX_LAUNCHES = 4096  # cached launch shapes per buffer sequence (one per distinct pair count)


class TritonRowMover:
    """Moves every buffer in one Triton launch; large moves without a grouping hint take more.

    * ``independent_groups=G`` (a promise that every hazard — a pair reading a slot another
      moving pair writes — stays inside its group of G consecutive pairs; compaction plans keep
      it with G = S+1): one launch, programs own whole groups, any number of pairs. Checked on
      CPU always, on CUDA only with ``debug_checks`` (the check synchronises); a wrong promise
      on CUDA without it corrupts rows.
    * Otherwise, up to ``max_staged_moves`` pairs: one launch, all pairs in every program.
    * Otherwise: the segment plan (two small launches, ``kv_move_plan``), the planned move, and
      ``kv_move_scratch``'s fallback rounds (two launches each, at most ``scratch_bytes`` of
      scratch per round) that only run where the plan failed. No host sync on any path.

    ``register_words`` bounds one program's staged block (pairs × words of a row);
    ``group_lanes`` is how many pairs a grouped program stages (whole groups);
    ``plan_lanes``/``plan_window``: planned segments hold up to ``plan_lanes`` pairs and find a
    cut within ``plan_window`` pairs (hazards must stay within that distance). ``tile_words`` and
    ``num_warps`` override the heuristics, ``min_programs`` is the grid the tile is narrowed
    towards for small moves (tuning). The device table of each buffer sequence is built once
    and cached (``max_cached`` most recent, kept alive): pass the same tuple every time, as the
    pools do; so is each pair count's launch shape, so a repeated move costs one table lookup
    and one launch on the host. The workspace is per mover: issue one mover's moves on one
    stream.
    """

    def __init__(
        self,
        max_staged_moves: int = 512,
        register_words: int = 8192,
        group_lanes: int = 32,
        plan_lanes: int = 64,
        plan_window: int = 16,
        scratch_bytes: int = 256 << 20,
        tile_words: int | None = None,
        num_warps: int | None = None,
        min_programs: int = kv_move_table.MIN_PROGRAMS,
        debug_checks: bool = False,
        max_cached: int = 8,
    ) -> None:
        for name, value in [("group_lanes", group_lanes), ("plan_lanes", plan_lanes)]:
            if value < 1 or value & (value - 1) or value > register_words:
                raise ValueError(f"{name} must be a power of two <= register_words, got {value}")
        if not 1 <= max_staged_moves <= register_words:
            raise ValueError(f"need 1 <= max_staged_moves <= register_words ({register_words})")
        if plan_window < 1 or plan_window & (plan_window - 1) or 2 * plan_window > plan_lanes:
            raise ValueError(
                f"plan_window must be a power of two <= plan_lanes / 2, got {plan_window}"
            )
        self._max_staged_moves = max_staged_moves
        self._register_words = register_words
        self._group_lanes = group_lanes
        self._plan_lanes = plan_lanes
        self._plan_window = plan_window
        self._scratch_bytes = scratch_bytes
        self._tile_words = tile_words
        self._num_warps = num_warps
        self._min_programs = min_programs
        self._debug_checks = debug_checks
        self._max_cached = max_cached
        self._prepared: OrderedDict[tuple[int, ...], _PreparedBuffers] = OrderedDict()

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
        table = prepared.table
        tgt, src = tgt.contiguous(), src.contiguous()
        launch = prepared.launches.get((num_moves, independent_groups))
        if launch is None:
            launch = self._launch(prepared, num_moves, independent_groups)
        if launch.pairs_per_segment:
            kv_move.move_rows_in_segments(
                table, tgt, src, launch.pairs_per_segment, launch.num_segments, launch.shape
            )
            return
        seg_starts = torch.empty(launch.num_segments + 1, dtype=torch.int32, device=tgt.device)
        kv_move_plan.plan_segments(
            tgt,
            src,
            prepared.mark,
            prepared.flag,
            seg_starts,
            self._plan_lanes - self._plan_window,
            self._plan_window,
        )
        kv_move.move_rows_in_planned_segments(
            table, tgt, src, seg_starts, prepared.flag, launch.shape
        )
        kv_move_scratch.move_rows_through_scratch(
            table, tgt, src, prepared.flag, launch.shape, self._scratch_bytes
        )

    def launch_grid(
        self,
        buffers: Sequence[torch.Tensor],
        num_moves: int,
        independent_groups: int | None = None,
    ) -> tuple[tuple[int, int, int], kv_move_table.TileShape] | None:
        """Grid and tile shape of the one launch that moves ``num_moves`` pairs, or None when
        the move takes the device plan. For benchmarks and tests; builds the table if needed."""
        prepared = self._prepare(buffers)
        launch = self._launch(prepared, num_moves, independent_groups)
        if not launch.pairs_per_segment:
            return None
        grid = (launch.num_segments, prepared.table.num_buffers, launch.shape.num_tiles)
        return grid, launch.shape

    def _launch(
        self, prepared: _PreparedBuffers, num_moves: int, independent_groups: int | None
    ) -> _Launch:
        """Segments and tile shape of a move: host arithmetic worth caching, because small
        moves are launch-bound and every microsecond of Python is a microsecond of the move."""
        segment = self._fixed_segment(num_moves, independent_groups)
        if segment is not None:
            num_segments = _cdiv(num_moves, segment)
            shape = self._shape(prepared.table, segment, num_segments)
            launch = _Launch(segment, num_segments, shape)
        else:
            pairs = self._plan_lanes - self._plan_window
            num_segments = kv_move_plan.num_planned_segments(num_moves, pairs)
            launch = _Launch(
                0, num_segments, self._shape(prepared.table, self._plan_lanes, num_segments)
            )
        if len(prepared.launches) >= _MAX_LAUNCHES:
            prepared.launches.clear()
        prepared.launches[(num_moves, independent_groups)] = launch
        return launch

    def _fixed_segment(self, num_moves: int, independent_groups: int | None) -> int | None:
        """Pairs per segment of a one-launch move, or None when the move needs a plan."""
        if independent_groups is not None and independent_groups <= self._max_staged_moves:
            whole_groups = max(1, self._group_lanes // independent_groups) * independent_groups
            return min(whole_groups, num_moves)
        if num_moves <= self._max_staged_moves:
            return num_moves
        return None

    def _shape(
        self, table: kv_move_table.RowTable, pairs: int, num_segments: int
    ) -> kv_move_table.TileShape:
        return kv_move_table.tile_shape(
            table,
            lanes=_next_pow2(pairs),
            num_segments=num_segments,
            register_words=self._register_words,
            tile_words=self._tile_words,
            num_warps=self._num_warps,
            min_programs=self._min_programs,
        )

    def _prepare(self, buffers: Sequence[torch.Tensor]) -> _PreparedBuffers:
        # A tuple is immutable, so its identity names its contents; other sequences by element.
        key = (id(buffers),) if isinstance(buffers, tuple) else tuple(map(id, buffers))
        prepared = self._prepared.get(key)
        if prepared is not None:
            self._prepared.move_to_end(key)
            return prepared
        table = kv_move_table.build_row_table(tuple(buffers))
        device = buffers[0].device
        prepared = _PreparedBuffers(
            table=table,
            mark=torch.full((table.max_rows,), -1, dtype=torch.int32, device=device),
            flag=torch.zeros(1, dtype=torch.int32, device=device),
            owner=buffers,
            launches={},
        )
        self._prepared[key] = prepared
        while len(self._prepared) > self._max_cached:
            self._prepared.popitem(last=False)
        return prepared


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(value: int) -> int:
    return 1 << (value - 1).bit_length()
