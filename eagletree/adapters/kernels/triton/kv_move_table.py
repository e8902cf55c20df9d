"""Adapter: the host side of the fused Triton KV move — the buffers' row table, the launch shape.

``build_row_table`` describes every buffer of a pool as one row of a device table (base address,
row width and slot stride in words, and whether 16-byte vectors fit), checked once per buffer
tuple; ``segment_launch`` cuts a move into segments of whole pair groups and one program's
register block into pair lanes and a column tile. The kernel that reads both is ``kv_move``'s.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import triton.language as tl

VECTOR_BYTES = 16  # one 128-bit access per thread: the widest global load / store
_WORD_TYPES = {4: tl.int32, 2: tl.int16, 1: tl.uint8}
_MIN_TILE_BYTES = 128  # narrower tiles than a cache line waste DRAM bursts
MIN_PROGRAMS = 512  # about four programs per SM: small moves are latency-bound, spread them


class RowTable(NamedTuple):
    """Device description of the buffers a move touches; build once per buffer tuple."""

    base_ptrs: torch.Tensor  # (num_buffers,) int64 byte addresses
    row_words: torch.Tensor  # (num_buffers,) int64 words per row
    stride_words: torch.Tensor  # (num_buffers,) int64 words between consecutive slots
    vector_aligned: torch.Tensor  # (num_buffers,) int64: 1 when 16-byte vectors fit
    word_bytes: int
    vector_words: int  # words per 16-byte vector if any buffer is aligned, else 1
    num_buffers: int
    max_row_words: int
    buffers: tuple[torch.Tensor, ...]  # kept alive while the table points at them


def build_row_table(buffers: tuple[torch.Tensor, ...]) -> RowTable:
    """Checks rows, device and disjoint address ranges, then uploads the table (host to device)."""
    # buffers: each (num_slots, *row_shape) with contiguous rows
    if not buffers:
        raise ValueError("a row table needs at least one buffer")
    device = buffers[0].device
    spans, rows = [], []
    for buf in buffers:
        if buf.device != device:
            raise ValueError(f"buffers on {device} and {buf.device}; one move is one device")
        if buf.dim() == 0 or not buf[:1].is_contiguous():
            raise ValueError(f"rows must be contiguous, got shape {tuple(buf.shape)}")
        row_numel = buf[0].numel() if buf.shape[0] else 0
        if buf.shape[0] > 1 and buf.stride(0) < row_numel:
            raise ValueError(f"slot stride {buf.stride(0)} < row size {row_numel}: rows overlap")
        size = buf.element_size()
        row_bytes, stride_bytes = row_numel * size, buf.stride(0) * size
        rows.append((buf.data_ptr(), row_bytes, stride_bytes))
        end = buf.data_ptr() + stride_bytes * max(buf.shape[0] - 1, 0) + row_bytes
        spans.append((buf.data_ptr(), end))
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start < end:
            raise ValueError("buffers overlap in memory; a fused move needs disjoint buffers")
    word_bytes = next(w for w in (4, 2, 1) if all(v % w == 0 for row in rows for v in row))
    aligned = [all(v % VECTOR_BYTES == 0 for v in row) for row in rows]
    table = torch.tensor(
        [
            [ptr, row // word_bytes, stride // word_bytes, int(ok)]
            for (ptr, row, stride), ok in zip(rows, aligned, strict=True)
        ],
        dtype=torch.int64,
    )
    table = table.t().contiguous().to(device)
    return RowTable(
        base_ptrs=table[0],
        row_words=table[1],
        stride_words=table[2],
        vector_aligned=table[3],
        word_bytes=word_bytes,
        vector_words=VECTOR_BYTES // word_bytes if any(aligned) else 1,
        num_buffers=len(buffers),
        max_row_words=max(row // word_bytes for _, row, _ in rows),
        buffers=buffers,
    )


def word_type(table: RowTable) -> tl.dtype:
    """The Triton word type rows are copied as."""
    return _WORD_TYPES[table.word_bytes]


class Tuning(NamedTuple):
    """How moves are cut into launches. The defaults are what the engine runs; the rest is for
    tests (tiny blocks on small shapes) and tuning runs."""

    max_staged_moves: int = 512  # most pairs one program stages: the largest group it moves
    group_lanes: int = 32  # pairs a program of a grouped move stages (whole groups, at least one)
    register_words: int = 8192  # one program's register block: pair lanes × tile words
    tile_words: int | None = None  # column tile override
    num_warps: int | None = None  # warps override
    min_programs: int = MIN_PROGRAMS  # the grid a small move's tile is narrowed towards


class TileShape(NamedTuple):
    """How one program's register block is cut: ``lanes`` pairs × ``tile`` words of a row."""

    lanes: int  # power of two >= the longest segment
    tile: int  # power of two, a multiple of the table's vector width
    num_tiles: int  # column tiles covering the widest row
    num_warps: int


class Launch(NamedTuple):
    """One launch of ``kv_move.move_rows``: segment × buffer × column tile programs."""

    pairs_per_segment: int
    grid: tuple[int, int, int]  # (segments, buffers, column tiles)
    shape: TileShape


def segment_launch(
    table: RowTable, num_moves: int, independent_groups: int | None, tuning: Tuning
) -> Launch | None:
    """The one launch that moves ``num_moves`` pairs, or None when a group — without a hint, the
    whole move — has more pairs than one program stages (``tuning.max_staged_moves``).

    A segment is as many whole groups of ``independent_groups`` consecutive pairs as fit
    ``group_lanes`` (at least one), so a true hint keeps every hazard inside one segment.
    """
    group = num_moves if independent_groups is None else min(independent_groups, num_moves)
    if group < 1:
        raise ValueError(f"independent_groups must be >= 1, got {independent_groups}")
    if group > tuning.max_staged_moves:
        return None
    segment = min(max(1, tuning.group_lanes // group) * group, num_moves)
    num_segments = _cdiv(num_moves, segment)
    shape = tile_shape(table, 1 << (segment - 1).bit_length(), num_segments, tuning)
    return Launch(segment, (num_segments, table.num_buffers, shape.num_tiles), shape)


def tile_shape(table: RowTable, lanes: int, num_segments: int, tuning: Tuning) -> TileShape:
    """The widest tile that fits ``register_words`` per program, narrowed while it would mask
    over 1/8 of the widest row or leave the GPU with fewer than ``min_programs`` programs."""
    width, vec = table.max_row_words, table.vector_words
    widest = 1 << (width - 1).bit_length()
    tile = tuning.tile_words
    if tile is None:
        tile = min(_floor_pow2(max(tuning.register_words // lanes, 1)), widest)
        floor = min(widest, max(vec, _MIN_TILE_BYTES // table.word_bytes))
        while tile > floor and _cdiv(width, tile) * tile * 8 > width * 9:
            tile //= 2
        while tile > floor and num_segments * table.num_buffers * _cdiv(width, tile) < (
            tuning.min_programs
        ):
            tile //= 2
        tile = max(tile, vec)
    if tile & (tile - 1) or tile % vec:
        raise ValueError(f"tile of {tile} words: need a power of two and a multiple of {vec}")
    num_warps = tuning.num_warps
    if num_warps is None:  # about 32 words (eight 16-byte vectors) per thread
        num_warps = min(8, max(2, _floor_pow2(max(lanes * tile // 1024, 1))))
    return TileShape(lanes, tile, _cdiv(width, tile), num_warps)


def _floor_pow2(value: int) -> int:
    return 1 << (value.bit_length() - 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
