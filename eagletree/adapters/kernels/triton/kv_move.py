"""Triton: move KV rows between slots of many buffers at once (the fused ``move_kv_cache``).

Every buffer of a pool is described by one row of a device table (base address, row width and
row stride, in words), so one launch covers every layer. Rows are copied as raw words (int32
when every address, width and stride allows, else int16 or uint8), which makes the copy
bit-exact for any dtype, fp8 included, and keeps the interpreter away from bf16 arithmetic.

Why the result equals ``domain.kv_move.move_rows_reference`` for ANY (tgt, src) with distinct
targets (chains and cycles included):

* A program owns one column tile of one buffer, for every pair. Column tiles are disjoint and
  buffers do not overlap (checked when the table is built), so no two programs touch one byte.
* Staged launch (``move_rows_staged``, all pairs in one block): the program loads the tile of
  every source row into registers, passes a CTA barrier, and only then stores. No store can
  precede a load of the same program, so every source is read before any target is written.
* Chunked launch (large moves, ``move_rows_chunked``): pairs are processed in blocks of
  ``CHUNK`` in order, each block staged as above. That is correct unless a pair reads a row
  that a pair of an EARLIER block wrote ("backward hazard"; a later block's write is ordered
  after this block's loads by the barriers). ``find_backward_hazards`` decides this on the device
  (no host sync); the chunked launch runs only when there is none, otherwise the fallback
  ``move_rows_through_scratch`` does (each launch checks the flag and the other returns at once).
  Compaction plans (targets packed in request order, a target never after its source within a
  request window) never have a backward hazard, so they always take the single-pass path.
* Fallback: one program per SM loops over (buffer, column tile) work items; for each, it copies
  the tile of every source into its private scratch, passes a barrier, then writes the targets.
  Two passes over the data, but correct for any pairs with memory bounded by the scratch size.
* Pairs with ``tgt == src`` (including (0, 0) padding) are skipped: they would rewrite a row with
  its own bytes.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

_WORD_DTYPES = {4: (torch.int32, tl.int32), 2: (torch.int16, tl.int16), 1: (torch.uint8, tl.uint8)}


class RowTable(NamedTuple):
    """Device description of the buffers a move touches; build once per buffer list."""

    base_ptrs: torch.Tensor  # (num_buffers,) int64 byte addresses
    row_words: torch.Tensor  # (num_buffers,) int64 words per row
    stride_words: torch.Tensor  # (num_buffers,) int64 words between consecutive slots
    word_bytes: int
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
    table = torch.tensor(
        [[ptr, row // word_bytes, stride // word_bytes] for ptr, row, stride in rows],
        dtype=torch.int64,
    )
    table = table.t().contiguous().to(device)
    return RowTable(
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
def _move_tiles_kernel(
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


@triton.jit
def _mark_targets_kernel(tgt_ptr, num_moves, mark_ptr, hazard_flag_ptr, BLOCK: tl.constexpr):
    """mark[tgt[i]] = i; program 0 also clears the hazard flag for the check that follows."""
    moves = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = moves < num_moves
    tgt = tl.load(tgt_ptr + moves, mask=in_range, other=0).to(tl.int64)
    tl.store(mark_ptr + tgt, moves.to(tl.int32), mask=in_range)
    if tl.program_id(0) == 0:
        tl.store(hazard_flag_ptr, 0)


@triton.jit
def _find_backward_hazards_kernel(
    tgt_ptr, src_ptr, num_moves, mark_ptr, hazard_flag_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr
):
    """Flag a pair whose source is written by a real (tgt != src) pair of an earlier chunk.

    ``mark`` is never cleared: a stale entry j is recognised because ``tgt[j]`` is not the slot.
    """
    moves = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = moves < num_moves
    src = tl.load(src_ptr + moves, mask=in_range, other=0).to(tl.int64)
    writer = tl.load(mark_ptr + src, mask=in_range, other=-1).to(tl.int64)
    known = in_range & (writer >= 0) & (writer < num_moves)
    writer_tgt = tl.load(tgt_ptr + writer, mask=known, other=-1).to(tl.int64)
    writer_src = tl.load(src_ptr + writer, mask=known, other=-1).to(tl.int64)
    hazard = known & (writer_tgt == src) & (writer_src != src) & (writer // CHUNK < moves // CHUNK)
    found = tl.max(hazard.to(tl.int32), axis=0)
    if found != 0:
        tl.atomic_max(hazard_flag_ptr, 1)


@triton.jit
def _move_through_scratch_kernel(
    base_ptrs,
    row_words,
    stride_words,
    tgt_ptr,
    src_ptr,
    num_moves,
    hazard_flag_ptr,
    scratch_ptr,
    num_tiles,
    num_items,
    WORD: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
):
    """Fallback for moves with a backward hazard: per work item all sources to scratch, then out."""
    if tl.load(hazard_flag_ptr) == 0:
        return
    program = tl.program_id(0)
    scratch = scratch_ptr + program.to(tl.int64) * num_moves * TILE
    lanes = tl.arange(0, TILE)
    for item in range(program, num_items, tl.num_programs(0)):
        buf = item // num_tiles
        cols = (item % num_tiles) * TILE + lanes
        width = tl.load(row_words + buf)
        base = tl.load(base_ptrs + buf).to(tl.pointer_type(WORD))
        stride = tl.load(stride_words + buf)
        col_mask = cols < width
        for start in range(0, num_moves, BLOCK):
            moves = start + tl.arange(0, BLOCK)
            in_range = moves < num_moves
            src = tl.load(src_ptr + moves, mask=in_range, other=0).to(tl.int64)
            mask = in_range[:, None] & col_mask[None, :]
            rows = tl.load(base + src[:, None] * stride + cols[None, :], mask=mask)
            tl.store(scratch + moves.to(tl.int64)[:, None] * TILE + lanes[None, :], rows, mask=mask)
        tl.debug_barrier()  # the whole tile of every source is in scratch before any write
        for start in range(0, num_moves, BLOCK):
            moves = start + tl.arange(0, BLOCK)
            in_range = moves < num_moves
            tgt = tl.load(tgt_ptr + moves, mask=in_range, other=0).to(tl.int64)
            mask = in_range[:, None] & col_mask[None, :]
            rows = tl.load(scratch + moves.to(tl.int64)[:, None] * TILE + lanes[None, :], mask=mask)
            tl.store(base + tgt[:, None] * stride + cols[None, :], rows, mask=mask)
        tl.debug_barrier()  # scratch is reused by the next item only after every thread is done


def can_run_on(device: torch.device) -> bool:
    """CUDA always; CPU tensors only when the kernels were defined under TRITON_INTERPRET=1."""
    return device.type != "cpu" or not isinstance(_move_tiles_kernel, triton.runtime.JITFunction)


def _word(table: RowTable) -> tl.dtype:
    return _WORD_DTYPES[table.word_bytes][1]


def _num_warps(block_words: int) -> int:
    return 8 if block_words >= 4096 else 4


def move_rows_staged(
    table: RowTable, tgt: torch.Tensor, src: torch.Tensor, register_words: int
) -> None:
    """One launch, all pairs in one register block; needs next_pow2(num_moves) <= register_words."""
    # tgt, src: (num_moves,) int32/int64 slot ids on the table's device, contiguous
    num_moves = tgt.numel()
    if num_moves == 0:
        return
    chunk = triton.next_power_of_2(num_moves)
    assert chunk <= register_words, "staged move: too many pairs for one register block"
    tile = min(register_words // chunk, triton.next_power_of_2(table.max_row_words))
    grid = (triton.cdiv(table.max_row_words, tile), table.num_buffers)
    _move_tiles_kernel[grid](
        table.base_ptrs, table.row_words, table.stride_words, tgt, src, num_moves, None,
        WORD=_word(table), CHUNK=chunk, TILE=tile, GATED=False,
        num_warps=_num_warps(chunk * tile),
    )  # fmt: skip


def find_backward_hazards(
    tgt: torch.Tensor, src: torch.Tensor, mark: torch.Tensor, flag: torch.Tensor, chunk: int
) -> None:
    """Sets ``flag[0]`` to 1 iff chunked processing in blocks of ``chunk`` would be wrong."""
    # mark: (>= max slot + 1,) int32 scratch, any content; flag: (1,) int32
    num_moves, block = tgt.numel(), 1024
    grid = (triton.cdiv(num_moves, block),)
    _mark_targets_kernel[grid](tgt, num_moves, mark, flag, BLOCK=block)
    _find_backward_hazards_kernel[grid](tgt, src, num_moves, mark, flag, CHUNK=chunk, BLOCK=block)


def move_rows_chunked(
    table: RowTable,
    tgt: torch.Tensor,
    src: torch.Tensor,
    flag: torch.Tensor,
    chunk: int,
    register_words: int,
) -> None:
    """One launch that does the move when ``flag[0] == 0`` (no backward hazard), else nothing."""
    tile = min(max(register_words // chunk, 1), triton.next_power_of_2(table.max_row_words))
    grid = (triton.cdiv(table.max_row_words, tile), table.num_buffers)
    _move_tiles_kernel[grid](
        table.base_ptrs, table.row_words, table.stride_words, tgt, src, tgt.numel(), flag,
        WORD=_word(table), CHUNK=chunk, TILE=tile, GATED=True,
        num_warps=_num_warps(chunk * tile),
    )  # fmt: skip


def scratch_tile_words(table: RowTable, num_moves: int, programs: int, scratch_bytes: int) -> int:
    """Widest power-of-two tile whose per-program scratch fits the budget (at least one word)."""
    per_word = programs * num_moves * table.word_bytes
    tile = 1
    while tile * 2 * per_word <= scratch_bytes and tile < min(table.max_row_words, 256):
        tile *= 2
    return tile


def scratch_dtype(table: RowTable) -> torch.dtype:
    """The dtype a scratch tensor for ``move_rows_through_scratch`` must have (the word type)."""
    return _WORD_DTYPES[table.word_bytes][0]


def move_rows_through_scratch(
    table: RowTable,
    tgt: torch.Tensor,
    src: torch.Tensor,
    flag: torch.Tensor,
    scratch: torch.Tensor,
    programs: int,
    tile: int,
) -> None:
    """One launch that moves when ``flag[0] != 0``; ``scratch`` holds programs·n·tile words."""
    num_moves = tgt.numel()
    assert scratch.dtype == scratch_dtype(table) and scratch.numel() >= programs * num_moves * tile
    num_tiles = triton.cdiv(table.max_row_words, tile)
    block = max(1, min(triton.next_power_of_2(num_moves), 4096 // tile))
    _move_through_scratch_kernel[(programs,)](
        table.base_ptrs, table.row_words, table.stride_words, tgt, src, num_moves, flag, scratch,
        num_tiles, num_tiles * table.num_buffers,
        WORD=_word(table), BLOCK=block, TILE=tile, num_warps=_num_warps(block * tile),
    )  # fmt: skip
