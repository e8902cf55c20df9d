"""Triton: move KV rows between slots of many buffers in one launch (the fused ``move_kv_cache``).

Every buffer of a pool is one row of a device table (base address, row width and slot stride in
words, and whether 16-byte vectors fit), so one launch covers every layer. Rows are copied as raw
words (int32 when every address, width and stride allows, else int16 or uint8), bit-exact for any
dtype, fp8 included; buffers whose address, row and stride are multiples of 16 bytes are copied
with 16-byte vector accesses. ``kv_move_table`` builds the table and the launch shape.

The pairs are cut into consecutive *segments*. A program owns one segment, one buffer and one
column tile: it loads the tile of every moving source row of its segment into registers, passes
a CTA barrier, then stores them at the targets. Why that equals
``domain.kv_move.move_rows_reference`` (every source read before any target written):

* Programs of different buffers or column tiles touch disjoint bytes (buffers never overlap:
  checked when the table is built).
* Inside a program, every load precedes every store (the barrier orders the threads).
* Programs of different segments may run in any order, so the segmentation must keep every
  *hazard* inside one segment: a pair reading a slot that another moving pair writes. Targets are
  distinct, so no two programs write one byte; reads of a slot nobody writes can happen any time.
  One segment of every pair, or segments of whole caller-declared independent groups, do.

Pairs with ``tgt == src``, (0, 0) padding included, are skipped: they would rewrite a row with its
own bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.kv_move_table import Launch, RowTable, word_type


@triton.jit
def _buffer_rows(base_ptrs, row_words, stride_words, buf, WORD: tl.constexpr, VEC: tl.constexpr):
    """Base pointer, slot stride and row width (words) of buffer ``buf``.

    With VEC > 1 the caller vouches for 16-byte alignment. ``tl.multiple_of`` marks the op that
    defines its value, so a hinted call and a plain call must stay separate calls (separate
    loads): one shared load would carry the hint into the unaligned path as well.
    """
    base = tl.load(base_ptrs + buf).to(tl.pointer_type(WORD))
    stride = tl.load(stride_words + buf)
    width = tl.load(row_words + buf)
    if VEC > 1:
        base = tl.multiple_of(base, 16)
        stride = tl.multiple_of(stride, VEC)
        width = tl.multiple_of(width, VEC)
    return base, stride, width


@triton.jit
def _row_tile_pointers(base, stride, width, slots, col0, TILE: tl.constexpr):
    """Pointers to words [col0, col0 + TILE) of rows ``slots``, and the mask of the columns
    inside the row (``_buffer_rows`` gives base, stride and width)."""
    cols = col0 + tl.arange(0, TILE)
    return base + slots[:, None] * stride + cols[None, :], (cols < width)[None, :]


@triton.jit
def _stage_and_store(base, stride, width, tgt, src, moving, col0, TILE: tl.constexpr):
    src_rows, in_row = _row_tile_pointers(base, stride, width, src, col0, TILE)
    tgt_rows, _ = _row_tile_pointers(base, stride, width, tgt, col0, TILE)
    mask = moving[:, None] & in_row
    rows = tl.load(src_rows, mask=mask)
    tl.debug_barrier()  # every thread's loads are performed before any thread stores
    tl.store(tgt_rows, rows, mask=mask)


@triton.jit
def _stage_in_parts(base, stride, width, tgt, src, moving, col0, TILE: tl.constexpr):
    """Single words in SPLIT column parts, each loaded, fenced and stored on its own (parts are
    disjoint bytes, so that is still every load of a byte before any store of it): a whole tile
    of scalar accesses would need a 64-bit address register pair per word."""
    SPLIT: tl.constexpr = 8 if TILE >= 8 else TILE
    for part in tl.static_range(SPLIT):
        _stage_and_store(
            base, stride, width, tgt, src, moving, col0 + part * (TILE // SPLIT), TILE // SPLIT
        )


@triton.jit
def _stage_rows(
    base_ptrs, row_words, stride_words, vector_aligned, buf, tgt, src, moving, col0,
    WORD: tl.constexpr, TILE: tl.constexpr, VEC: tl.constexpr,
):  # fmt: skip
    """Copies the column tile of every moving source row to its target, all loads first.

    Aligned buffers take 16-byte vectors over the whole tile, the others single words in
    parts (``_stage_in_parts``). Both paths' table entries are loaded here, before the branch
    and alongside the caller's pair loads: after an L2 flush every load that waits for
    another is a DRAM round trip, and a small move is nothing but such round trips.
    """
    base, stride, width = _buffer_rows(base_ptrs, row_words, stride_words, buf, WORD, 1)
    if VEC > 1:
        aligned = tl.load(vector_aligned + buf) != 0
        v_base, v_stride, v_width = _buffer_rows(base_ptrs, row_words, stride_words, buf, WORD, VEC)
        if aligned:
            _stage_and_store(v_base, v_stride, v_width, tgt, src, moving, col0, TILE)
        else:
            _stage_in_parts(base, stride, width, tgt, src, moving, col0, TILE)
    else:
        _stage_in_parts(base, stride, width, tgt, src, moving, col0, TILE)


@triton.jit
def _move_rows_kernel(
    base_ptrs, row_words, stride_words, vector_aligned, tgt_ptr, src_ptr, num_moves,
    pairs_per_segment, WORD: tl.constexpr, VEC: tl.constexpr, LANES: tl.constexpr,
    TILE: tl.constexpr,
):  # fmt: skip
    """One segment × buffer × column tile: segment s is pairs ``[s·p, (s+1)·p)`` (p =
    ``pairs_per_segment``, the last one cut at ``num_moves``).

    No early exit: a tile past a narrow row is masked instead, because the compiler sinks loads
    below an exit, and a branch on the row width would make every pair and table load wait for
    it (three DRAM round trips before the rows instead of one, see ``_stage_rows``).
    """
    segment = tl.program_id(0)
    buf = tl.program_id(1)
    col0 = tl.program_id(2) * TILE
    start = segment * pairs_per_segment
    end = tl.minimum(start + pairs_per_segment, num_moves)
    moves = start + tl.arange(0, LANES)
    in_segment = moves < end
    tgt = tl.load(tgt_ptr + moves, mask=in_segment, other=0).to(tl.int64)
    src = tl.load(src_ptr + moves, mask=in_segment, other=0).to(tl.int64)
    moving = in_segment & (tgt != src)
    _stage_rows(
        base_ptrs, row_words, stride_words, vector_aligned, buf, tgt, src, moving, col0,
        WORD, TILE, VEC,
    )  # fmt: skip


def can_run_on(device: torch.device) -> bool:
    """CUDA always; CPU tensors only when the kernel was defined under TRITON_INTERPRET=1."""
    return device.type != "cpu" or not isinstance(_move_rows_kernel, triton.runtime.JITFunction)


def move_rows(table: RowTable, tgt: torch.Tensor, src: torch.Tensor, launch: Launch) -> None:
    """One launch moving every buffer of ``table`` (``kv_move_table.segment_launch`` shapes it).

    Precondition: no hazard crosses a segment (true of one segment of every pair, and of
    segments of whole independent groups).
    """
    # tgt, src: (num_moves,) int32/int64 slot ids on the table's device, contiguous
    shape = launch.shape
    _move_rows_kernel[launch.grid](
        table.base_ptrs, table.row_words, table.stride_words, table.vector_aligned, tgt, src,
        tgt.numel(), launch.pairs_per_segment,
        WORD=word_type(table), VEC=table.vector_words, LANES=shape.lanes, TILE=shape.tile,
        num_warps=shape.num_warps,
    )  # fmt: skip
