"""Triton: the KV move for any pairs, through scratch (the fallback of a failed segment plan).

Every (buffer, column tile) is an independent move of its own bytes, so the units are taken in
rounds that fit the scratch: one launch copies the tile of every moving pair's source row of the
round's units into scratch, the next launch writes them to the targets. The launch boundary puts
every read before any write, for any (tgt, src) with distinct targets. Both launches return at
once unless ``flag[0] != 0``, so a mover can queue them behind the plan without a host sync.
Twice the traffic of a direct move, plus two launches per round.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.kv_move import buffer_rows, row_tile_pointers
from eagletree.adapters.kernels.triton.kv_move_table import (
    RowTable,
    TileShape,
    word_dtype,
    word_type,
)

_MAX_PROGRAMS = 1024  # per fallback launch: about eight per SM, each looping over pair blocks


@triton.jit
def _scratch_pass(
    base,
    stride,
    width,
    slots,
    moving,
    col0,
    scratch_rows,
    TILE: tl.constexpr,
    TO_SCRATCH: tl.constexpr,
):
    """Words [col0, col0 + TILE) of rows ``slots``: to ``scratch_rows`` (pair, word), or back."""
    rows, in_row = row_tile_pointers(base, stride, width, slots, col0, TILE)
    mask = moving[:, None] & in_row
    if TO_SCRATCH:
        tl.store(scratch_rows, tl.load(rows, mask=mask), mask=mask)
    else:
        tl.store(rows, tl.load(scratch_rows, mask=mask), mask=mask)


@triton.jit
def _scratch_pass_kernel(
    base_ptrs,
    row_words,
    stride_words,
    vector_aligned,
    tgt_ptr,
    src_ptr,
    num_moves,
    flag_ptr,
    scratch_ptr,
    first_unit,
    num_tiles,
    num_blocks,
    WORD: tl.constexpr,
    VEC: tl.constexpr,
    LANES: tl.constexpr,
    TILE: tl.constexpr,
    TO_SCRATCH: tl.constexpr,
):
    """Block of LANES pairs × unit (buffer, column tile): sources to scratch, or scratch out.

    Unaligned buffers go in SPLIT column parts of single words, for the register reason given
    in ``kv_move.stage_rows``.
    """
    SPLIT: tl.constexpr = 8 if TILE >= 8 else TILE
    PART: tl.constexpr = TILE // SPLIT
    if tl.load(flag_ptr) == 0:
        return
    unit_in_round = tl.program_id(1)
    unit = first_unit + unit_in_round
    buf = unit // num_tiles
    col0 = (unit % num_tiles) * TILE
    base, stride, width = buffer_rows(base_ptrs, row_words, stride_words, buf, WORD, 1)
    if col0 >= width:
        return
    v_base, v_stride, v_width = buffer_rows(base_ptrs, row_words, stride_words, buf, WORD, VEC)
    aligned = False
    if VEC > 1:
        aligned = tl.load(vector_aligned + buf) != 0
    for block in range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        moves = block * LANES + tl.arange(0, LANES)
        in_range = moves < num_moves
        tgt = tl.load(tgt_ptr + moves, mask=in_range, other=0).to(tl.int64)
        src = tl.load(src_ptr + moves, mask=in_range, other=0).to(tl.int64)
        moving = in_range & (tgt != src)
        slots = src if TO_SCRATCH else tgt
        # scratch: (units in the round, num_moves, TILE) words
        scratch_rows = (
            scratch_ptr + (unit_in_round.to(tl.int64) * num_moves + moves)[:, None] * TILE
        )
        if aligned:
            _scratch_pass(
                v_base, v_stride, v_width, slots, moving, col0,
                scratch_rows + tl.arange(0, TILE)[None, :], TILE, TO_SCRATCH,
            )  # fmt: skip
        else:
            for part in tl.static_range(SPLIT):
                _scratch_pass(
                    base, stride, width, slots, moving, col0 + part * PART,
                    scratch_rows + part * PART + tl.arange(0, PART)[None, :], PART, TO_SCRATCH,
                )  # fmt: skip


def units_per_round(table: RowTable, num_moves: int, shape: TileShape, scratch_bytes: int) -> int:
    """How many (buffer, column tile) units one round holds: at least one, whatever the budget."""
    unit_bytes = num_moves * shape.tile * table.word_bytes
    total_units = table.num_buffers * shape.num_tiles
    return max(1, min(total_units, scratch_bytes // unit_bytes))


def move_rows_through_scratch(
    table: RowTable,
    tgt: torch.Tensor,
    src: torch.Tensor,
    flag: torch.Tensor,
    shape: TileShape,
    scratch_bytes: int,
) -> None:
    """Two launches per round that move when ``flag[0] != 0`` and return at once otherwise."""
    # tgt, src: (num_moves,) slot ids, distinct targets; flag: (1,) int32
    num_moves = tgt.numel()
    if num_moves == 0:
        return
    per_round = units_per_round(table, num_moves, shape, scratch_bytes)
    total_units = table.num_buffers * shape.num_tiles
    scratch = torch.empty(
        per_round * num_moves * shape.tile, dtype=word_dtype(table), device=tgt.device
    )  # the caching allocator reuses it stream-safely once this move is done
    blocks = triton.cdiv(num_moves, shape.lanes)
    for first_unit in range(0, total_units, per_round):
        units = min(per_round, total_units - first_unit)
        # A bounded grid that loops over pair blocks: when the flag says no, each of the two
        # launches per round costs a few hundred programs, not one per block and unit.
        programs = min(blocks, max(1, _MAX_PROGRAMS // units))
        for to_scratch in (True, False):
            _scratch_pass_kernel[(programs, units)](
                table.base_ptrs, table.row_words, table.stride_words, table.vector_aligned,
                tgt, src, num_moves, flag, scratch, first_unit, shape.num_tiles, blocks,
                WORD=word_type(table), VEC=table.vector_words, LANES=shape.lanes,
                TILE=shape.tile, TO_SCRATCH=to_scratch, num_warps=shape.num_warps,
            )  # fmt: skip
