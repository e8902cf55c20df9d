# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-calls, allow-untyped-decorators
"""Benchmark baseline: the first fused KV mover's one-launch staged path, frozen for comparison.

``benchmarks/kv_move.py --small`` times this next to the current ``TritonRowMover`` in one
run. It is the row table, ``_move_tiles_kernel`` and ``move_rows_staged`` of commit 82f74ef,
copied verbatim but for names, behind the host path of that commit's mover (cached table,
``contiguous``, one launch): one program per (column tile, buffer) stages every pair's tile,
the tile as wide as ``register_words // next_pow2(pairs)`` allows (a whole 2 KiB row for
bs = 1), 4-byte words without alignment hints. Staged moves only (up to 512 pairs). Delete this
file once the comparison is recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl

_WORD_DTYPES = {4: (torch.int32, tl.int32), 2: (torch.int16, tl.int16), 1: (torch.uint8, tl.uint8)}


class FirstRowTable(NamedTuple):
    base_ptrs: torch.Tensor  # (num_buffers,) int64 byte addresses
    row_words: torch.Tensor  # (num_buffers,) int64 words per row
    stride_words: torch.Tensor  # (num_buffers,) int64 words between consecutive slots
    word_bytes: int
    num_buffers: int
    max_row_words: int
    max_rows: int
    buffers: tuple[torch.Tensor, ...]


def build_first_row_table(buffers: tuple[torch.Tensor, ...]) -> FirstRowTable:
    device = buffers[0].device
    spans, rows = [], []
    for buf in buffers:
        size = buf.element_size()
        row_bytes = buf[0].numel() * size if buf.shape[0] else 0
        stride_bytes = (buf.stride(0) if buf.dim() > 1 else 1) * size
        rows.append((buf.data_ptr(), row_bytes, stride_bytes))
        spans.append((buf.data_ptr(), buf.data_ptr() + stride_bytes * max(buf.shape[0], 1)))
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start < end:
            raise ValueError("buffers overlap in memory; a fused move needs disjoint buffers")
    word_bytes = next(w for w in (4, 2, 1) if all(v % w == 0 for row in rows for v in row))
    table = torch.tensor(
        [[ptr, row // word_bytes, stride // word_bytes] for ptr, row, stride in rows],
        dtype=torch.int64,
    )
    table = table.t().contiguous().to(device)
    return FirstRowTable(
        base_ptrs=table[0],
        row_words=table[1],
        stride_words=table[2],
        word_bytes=word_bytes,
        num_buffers=len(buffers),
        max_row_words=max(row // word_bytes for _, row, _ in rows),
        max_rows=max(buf.shape[0] for buf in buffers),
        buffers=buffers,
    )


@triton.jit
def _first_move_tiles_kernel(
    base_ptrs,
    row_words,
    stride_words,
    tgt_ptr,
    src_ptr,
    num_moves,
    hazard_flag_ptr,
    WORD: tl.constexpr,
    CHUNK: tl.constexpr,
    TILE: tl.constexpr,
    GATED: tl.constexpr,
):
    """One column tile of one buffer for all pairs; per CHUNK pairs: load, barrier, store."""
    tile = tl.program_id(0)
    buf = tl.program_id(1)
    width = tl.load(row_words + buf)
    if tile * TILE >= width:
        return
    if GATED:  # noqa: SIM102 (a constexpr test; Triton does not mix it with a runtime `and`)
        if tl.load(hazard_flag_ptr) != 0:
            return
    base = tl.load(base_ptrs + buf).to(tl.pointer_type(WORD))
    stride = tl.load(stride_words + buf)
    cols = tile * TILE + tl.arange(0, TILE)
    col_mask = cols < width
    for start in range(0, num_moves, CHUNK):
        moves = start + tl.arange(0, CHUNK)
        in_range = moves < num_moves
        tgt = tl.load(tgt_ptr + moves, mask=in_range, other=0).to(tl.int64)
        src = tl.load(src_ptr + moves, mask=in_range, other=0).to(tl.int64)
        mask = (in_range & (tgt != src))[:, None] & col_mask[None, :]
        rows = tl.load(base + src[:, None] * stride + cols[None, :], mask=mask)
        tl.debug_barrier()  # every thread's loads are performed before any thread stores
        tl.store(base + tgt[:, None] * stride + cols[None, :], rows, mask=mask)


def _num_warps(block_words: int) -> int:
    return 8 if block_words >= 4096 else 4


def first_move_rows_staged(
    table: FirstRowTable, tgt: torch.Tensor, src: torch.Tensor, register_words: int
) -> None:
    """One launch, all pairs in one register block; needs next_pow2(num_moves) <= register_words."""
    num_moves = tgt.numel()
    if num_moves == 0:
        return
    chunk = triton.next_power_of_2(num_moves)
    assert chunk <= register_words, "staged move: too many pairs for one register block"
    tile = min(register_words // chunk, triton.next_power_of_2(table.max_row_words))
    grid = (triton.cdiv(table.max_row_words, tile), table.num_buffers)
    _first_move_tiles_kernel[grid](
        table.base_ptrs, table.row_words, table.stride_words, tgt, src, num_moves, None,
        WORD=_WORD_DTYPES[table.word_bytes][1], CHUNK=chunk, TILE=tile, GATED=False,
        num_warps=_num_warps(chunk * tile),
    )  # fmt: skip


class FirstStagedMover:
    """The staged path of 82f74ef's ``TritonRowMover`` (moves of at most 512 pairs)."""

    def __init__(self, max_staged_moves: int = 512, register_words: int = 8192) -> None:
        self._max_staged_moves = max_staged_moves
        self._register_words = register_words
        self._tables: dict[tuple[int, ...], FirstRowTable] = {}

    def move(
        self,
        buffers: Sequence[torch.Tensor],
        tgt: torch.Tensor,
        src: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        num_moves = tgt.numel()
        if num_moves == 0 or len(buffers) == 0:
            return
        if num_moves > self._max_staged_moves:
            raise ValueError("the frozen first version is kept for staged moves only")
        table = self._table(buffers)
        tgt, src = tgt.contiguous(), src.contiguous()
        first_move_rows_staged(table, tgt, src, self._register_words)

    def _table(self, buffers: Sequence[torch.Tensor]) -> FirstRowTable:
        key = (id(buffers),) if isinstance(buffers, tuple) else tuple(map(id, buffers))
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = build_first_row_table(tuple(buffers))
        return table

    def grid(self, buffers: Sequence[torch.Tensor], num_moves: int) -> tuple[int, int]:
        """(programs, warps) of a staged move of ``num_moves`` pairs."""
        table = self._table(buffers)
        chunk = triton.next_power_of_2(num_moves)
        tile = min(self._register_words // chunk, triton.next_power_of_2(table.max_row_words))
        return triton.cdiv(table.max_row_words, tile) * table.num_buffers, _num_warps(chunk * tile)
