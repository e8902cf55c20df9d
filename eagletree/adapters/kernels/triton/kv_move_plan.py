"""Triton: plan a large KV move's segments on the device so that no hazard crosses a segment.

A *hazard* is a pair i that reads a slot written by another moving pair w (``src[i] == tgt[w]``,
``tgt[w] != src[w]``); the edge joins pair indices ``lo = min(i, w)`` and ``hi = max(i, w)``.
A *cut* p (between pairs p - 1 and p) is usable when no edge has ``lo < p <= hi``. Segment s
starts at the first usable cut in ``[s·PAIRS, s·PAIRS + WINDOW)``, so with ``WINDOW <= PAIRS``
segments are disjoint, ordered and shorter than ``PAIRS + WINDOW`` pairs; each holds every edge
it touches, so ``kv_move.move_rows_in_planned_segments`` can move them all at once.

The plan fails, and sets the flag that hands the move to ``kv_move_scratch``, when an edge is
longer than WINDOW pairs or a window has no usable cut. Compaction plans never fail, in either
pair order: their edges stay inside one request's S+1 consecutive pairs, and every request
boundary is a usable cut (S + 1 <= WINDOW).

Why every edge that crosses a cut of segment s's window is seen by program s: an edge no longer
than WINDOW that crosses cut p has its reader in ``[p - WINDOW, p + WINDOW)``; program s scans
readers ``[s·PAIRS - WINDOW, s·PAIRS + max(PAIRS, 2·WINDOW))``. Longer edges are flagged by the
program that owns their reader, so a plan that does not fail has none.

Two launches, no host sync: ``mark[tgt[w]] = w`` for moving pairs, then one program per segment.
``mark`` is never cleared: a stale entry w is recognised because pair w does not write the slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MARK_BLOCK = 1024


@triton.jit
def _mark_writers_kernel(tgt_ptr, src_ptr, num_moves, mark_ptr, flag_ptr, BLOCK: tl.constexpr):
    """mark[tgt[w]] = w for every moving pair w; program 0 also clears the fallback flag."""
    moves = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = moves < num_moves
    tgt = tl.load(tgt_ptr + moves, mask=in_range, other=0).to(tl.int64)
    src = tl.load(src_ptr + moves, mask=in_range, other=0).to(tl.int64)
    tl.store(mark_ptr + tgt, moves, mask=in_range & (tgt != src))
    if tl.program_id(0) == 0:
        tl.store(flag_ptr, 0)


@triton.jit
def _plan_segments_kernel(
    tgt_ptr,
    src_ptr,
    num_moves,
    mark_ptr,
    flag_ptr,
    seg_starts_ptr,
    num_segments,
    PAIRS: tl.constexpr,
    WINDOW: tl.constexpr,
    SCAN: tl.constexpr,
):
    """seg_starts[s] = first usable cut in [s·PAIRS, s·PAIRS + WINDOW); flag = 1 on failure."""
    segment = tl.program_id(0)
    first = segment * PAIRS
    readers = first - WINDOW + tl.arange(0, SCAN)
    valid = (readers >= 0) & (readers < num_moves)
    tgt = tl.load(tgt_ptr + readers, mask=valid, other=0).to(tl.int64)
    src = tl.load(src_ptr + readers, mask=valid, other=0).to(tl.int64)
    reading = valid & (tgt != src)
    writer = tl.load(mark_ptr + src, mask=reading, other=-1)
    known = reading & (writer >= 0) & (writer < num_moves)
    writer_tgt = tl.load(tgt_ptr + writer, mask=known, other=-1).to(tl.int64)
    writer_src = tl.load(src_ptr + writer, mask=known, other=-1).to(tl.int64)
    edge = known & (writer_tgt == src) & (writer_src != writer_tgt)
    lo = tl.minimum(readers, writer)
    hi = tl.maximum(readers, writer)
    owned = (readers >= first) & (readers < first + PAIRS)
    too_long = tl.max((edge & owned & (hi - lo > WINDOW)).to(tl.int32), axis=0)
    cuts = first + tl.arange(0, WINDOW)
    crosses = edge[None, :] & (lo[None, :] < cuts[:, None]) & (cuts[:, None] <= hi[None, :])
    usable = (tl.max(crosses.to(tl.int32), axis=1) == 0) & (cuts <= num_moves)
    start = tl.min(tl.where(usable, cuts, first + WINDOW), axis=0)
    tl.store(seg_starts_ptr + segment, start)
    if segment == 0:
        tl.store(seg_starts_ptr + num_segments, num_moves)
    if (too_long != 0) | (start == first + WINDOW):
        tl.atomic_max(flag_ptr, 1)


def num_planned_segments(num_moves: int, pairs: int) -> int:
    """Segments of a plan of ``num_moves`` pairs (``seg_starts`` holds one more entry)."""
    return -(-num_moves // pairs)


def plan_segments(
    tgt: torch.Tensor,
    src: torch.Tensor,
    mark: torch.Tensor,
    flag: torch.Tensor,
    seg_starts: torch.Tensor,
    pairs: int,
    window: int,
) -> None:
    """Fills ``seg_starts`` and sets ``flag[0]`` to 1 iff the plan failed (else 0)."""
    # tgt, src: (num_moves,) slot ids; mark: (>= max slot + 1,) int32, any content;
    # flag: (1,) int32; seg_starts: (num_planned_segments(num_moves, pairs) + 1,) int32
    num_moves = tgt.numel()
    num_segments = num_planned_segments(num_moves, pairs)
    assert 1 <= window <= pairs and window & (window - 1) == 0
    assert seg_starts.numel() == num_segments + 1 and mark.dtype == seg_starts.dtype == torch.int32
    _mark_writers_kernel[(triton.cdiv(num_moves, _MARK_BLOCK),)](
        tgt, src, num_moves, mark, flag, BLOCK=_MARK_BLOCK
    )
    scan = triton.next_power_of_2(window + max(pairs, 2 * window))
    _plan_segments_kernel[(num_segments,)](
        tgt, src, num_moves, mark, flag, seg_starts, num_segments,
        PAIRS=pairs, WINDOW=window, SCAN=scan,
    )  # fmt: skip
