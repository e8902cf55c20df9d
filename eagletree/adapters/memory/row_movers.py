"""Adapter: RowMovers — per-buffer torch gather/scatter and the one-launch Triton move."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import torch

from eagletree.adapters.kernels.triton import kv_move
from eagletree.adapters.memory.raw_words import as_raw_words


class TorchRowMover:
    """Gathers the source rows into a temporary, then scatters them: two kernels per buffer."""

    def move(self, buffers: Sequence[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
        # buffers: each (num_slots, *row_shape); tgt, src: (num_moves,) integer slot ids
        if tgt.numel() == 0:
            return
        tgt_index, src_index = tgt.long(), src.long()
        for buf in buffers:
            words = as_raw_words(buf)
            words.index_copy_(0, tgt_index, words.index_select(0, src_index))


class _PreparedBuffers(NamedTuple):
    table: kv_move.RowTable
    mark: torch.Tensor  # (max_rows,) int32: which pair writes each slot (hazard check scratch)
    flag: torch.Tensor  # (1,) int32: 1 when a large move has a backward hazard
    owner: Sequence[torch.Tensor]  # the keyed sequence; holding it keeps every keyed id unique


class TritonRowMover:
    """Moves every buffer in one Triton launch (four for moves above ``max_staged_moves`` pairs).

    Up to ``max_staged_moves`` pairs: one launch, every pair staged through registers. Larger
    moves: a device-side hazard check (two small launches), then the chunked single-pass move,
    or, only if some pair reads a row an earlier chunk wrote, a two-pass fallback through at most
    ``scratch_bytes`` of scratch (the kernel module's docstring has the correctness argument).
    The device table of each buffer sequence is built once and cached (the ``max_cached``
    most recent sequences, which it keeps alive); pass the same tuple every time, as the pools do,
    and let a mover live as long as its pools. The workspace is per mover: issue one mover's
    moves on one stream.
    """

    def __init__(
        self,
        max_staged_moves: int = 512,
        chunk_moves: int = 64,
        register_words: int = 8192,
        scratch_bytes: int = 128 << 20,
        max_cached: int = 8,
    ) -> None:
        if not 1 <= max_staged_moves <= register_words or not 1 <= chunk_moves <= register_words:
            raise ValueError(
                f"need 1 <= max_staged_moves ({max_staged_moves}) and chunk_moves ({chunk_moves})"
                f" <= register_words ({register_words})"
            )
        if chunk_moves & (chunk_moves - 1):
            raise ValueError(f"chunk_moves must be a power of two, got {chunk_moves}")
        self._max_staged_moves = max_staged_moves
        self._chunk_moves = chunk_moves
        self._register_words = register_words
        self._scratch_bytes = scratch_bytes
        self._max_cached = max_cached
        self._prepared: OrderedDict[tuple[int, ...], _PreparedBuffers] = OrderedDict()
        self._programs: dict[torch.device, int] = {}

    def move(self, buffers: Sequence[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
        # buffers: each (num_slots, *row_shape), rows contiguous; tgt, src: (num_moves,) slot ids
        num_moves = tgt.numel()
        if num_moves == 0 or len(buffers) == 0:
            return
        if tgt.device.type == "cpu" and not kv_move.can_run_on(tgt.device):
            raise RuntimeError("TritonRowMover on CPU tensors needs TRITON_INTERPRET=1 at import")
        prepared = self._prepare(buffers)
        table = prepared.table
        tgt, src = tgt.contiguous(), src.contiguous()
        if num_moves <= self._max_staged_moves:
            kv_move.move_rows_staged(table, tgt, src, self._register_words)
            return
        chunk = self._chunk_moves
        kv_move.find_backward_hazards(tgt, src, prepared.mark, prepared.flag, chunk)
        kv_move.move_rows_chunked(table, tgt, src, prepared.flag, chunk, self._register_words)
        programs = self._num_programs(tgt.device)
        tile = kv_move.scratch_tile_words(table, num_moves, programs, self._scratch_bytes)
        scratch = torch.empty(
            programs * num_moves * tile, dtype=kv_move.scratch_dtype(table), device=tgt.device
        )  # the caching allocator reuses it stream-safely once this move is done
        kv_move.move_rows_through_scratch(
            table, tgt, src, prepared.flag, scratch, programs=programs, tile=tile
        )

    def _prepare(self, buffers: Sequence[torch.Tensor]) -> _PreparedBuffers:
        # A tuple is immutable, so its identity names its contents; other sequences by element.
        key = (id(buffers),) if isinstance(buffers, tuple) else tuple(map(id, buffers))
        prepared = self._prepared.get(key)
        if prepared is not None:
            self._prepared.move_to_end(key)
            return prepared
        table = kv_move.build_row_table(tuple(buffers))
        device = buffers[0].device
        prepared = _PreparedBuffers(
            table=table,
            mark=torch.full((table.max_rows,), -1, dtype=torch.int32, device=device),
            flag=torch.zeros(1, dtype=torch.int32, device=device),
            owner=buffers,
        )
        self._prepared[key] = prepared
        while len(self._prepared) > self._max_cached:
            self._prepared.popitem(last=False)
        return prepared

    def _num_programs(self, device: torch.device) -> int:
        """Fallback programs: one per SM on CUDA, two under the CPU interpreter."""
        if device not in self._programs:
            self._programs[device] = (
                torch.cuda.get_device_properties(device).multi_processor_count
                if device.type == "cuda"
                else 2
            )
        return self._programs[device]
