"""Adapter: the host side of the fused Triton KV move — the buffers' row table, the tile shape.

``build_row_table`` describes every buffer of a pool as one row of a device table (base address,
row width and slot stride in words, and whether 16-byte vectors fit), checked once per buffer
list; ``tile_shape`` cuts one program's register block into pair lanes and a column tile. The
kernels that read both are in ``kv_move``, ``kv_move_scratch`` and ``kv_move_plan``.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

VECTOR_BYTES = 16  # one 128-bit access per thread: the widest global load / store
_WORD_DTYPES = {4: (torch.int32, tl.int32), 2: (torch.int16, tl.int16), 1: (torch.uint8, tl.uint8)}
_MIN_TILE_BYTES = 128  # narrower tiles than a cache line waste DRAM bursts
MIN_PROGRAMS = 512  # about four programs per SM: small moves are latency-bound, spread them


class RowTable(NamedTuple):
    """Device description of the buffers a move touches; build once per buffer list."""

    base_ptrs: torch.Tensor  # (num_buffers,) int64 byte addresses
    row_words: torch.Tensor  # (num_buffers,) int64 words per row
    stride_words: torch.Tensor  # (num_buffers,) int64 words between consecutive slots
    vector_aligned: torch.Tensor  # (num_buffers,) int64: 1 when 16-byte vectors fit
    word_bytes: int
    vector_words: int  # words per 16-byte vector if any buffer is aligned, else 1
    num_buffers: int
    max_row_words: int
    max_rows: int
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
        max_rows=max(buf.shape[0] for buf in buffers),
        buffers=buffers,
    )


class TileShape(NamedTuple):
    """How one program's register block is cut: ``lanes`` pairs × ``tile`` words of a row."""

    lanes: int  # power of two >= the longest segment
    tile: int  # power of two, a multiple of the table's vector width
    num_tiles: int  # column tiles covering the widest row
    num_warps: int


def tile_shape(
    table: RowTable,
    lanes: int,
    num_segments: int,
    register_words: int,
    tile_words: int | None = None,
    num_warps: int | None = None,
    min_programs: int = MIN_PROGRAMS,
) -> TileShape:
    """The widest tile that fits ``register_words`` per program, narrowed while it would mask
    over 1/8 of the widest row or leave the GPU with fewer than ``min_programs`` programs."""
    width, vec = table.max_row_words, table.vector_words
    widest = triton.next_power_of_2(width)
    if tile_words is None:
        tile = min(_floor_pow2(max(register_words // lanes, 1)), widest)
        floor = min(widest, max(vec, _MIN_TILE_BYTES // table.word_bytes))
        while tile > floor and triton.cdiv(width, tile) * tile * 8 > width * 9:
            tile //= 2
        while tile > floor and num_segments * table.num_buffers * triton.cdiv(width, tile) < (
            min_programs
        ):
            tile //= 2
        tile = max(tile, vec)
    else:
        tile = tile_words
    if tile & (tile - 1) or tile % vec:
        raise ValueError(f"tile of {tile} words: need a power of two and a multiple of {vec}")
    if num_warps is None:  # about 32 words (eight 16-byte vectors) per thread
        num_warps = min(8, max(2, _floor_pow2(max(lanes * tile // 1024, 1))))
    return TileShape(lanes, tile, triton.cdiv(width, tile), num_warps)


def _floor_pow2(value: int) -> int:
    return 1 << (value.bit_length() - 1)


def word_type(table: RowTable) -> tl.dtype:
    """The Triton word type rows are copied as."""
    return _WORD_DTYPES[table.word_bytes][1]


def word_dtype(table: RowTable) -> torch.dtype:
    """The torch twin of ``word_type`` (the dtype of a scratch tensor)."""
    return _WORD_DTYPES[table.word_bytes][0]
