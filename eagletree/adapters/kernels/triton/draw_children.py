"""Triton: a drawn node's children, k draws without replacement, one program per row
(``domain.tree_sampling.draw_children`` semantics).

The torch reference takes about fifteen small kernels a draw (the mass left, the inverse CDF,
the score, the removal), k draws a beam row: hundreds of launches a drawn tree step. Here a
program reads its row once, keeping each block of ``BLOCK_V`` columns' mass and Σ q² in
registers; a draw then scans those block sums for the block its coin falls in and reads that
one block for the column, and the drawn column's removal updates that block's two sums (taken
again from what the block has left, not by subtraction). One pass over the vocabulary and two
block reads a draw, where a pass per draw made a k = 8 row read the vocabulary sixteen times
(0.86 ms of an S = 6 tree step at bs 1 on the H200). Per-element arithmetic as the reference;
its sums run in another order, so a coin within a rounding of a token's cumulative edge may
pick the neighbour. No host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.tree_verify import pick
from eagletree.domain.tree_sampling import FIRST_DRAW_SCORE


@triton.jit
def _draw_children_kernel(
    probs_ptr,  # (rows, V) float32, unit column stride
    coins_ptr,  # (rows, K) float32, unit column stride
    columns_ptr,  # (rows, K) int64 out
    scores_ptr,  # (rows, K) float32 out
    vocab,
    stride_probs,
    stride_coins,
    first_score,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,  # a power of two at least cdiv(vocab, BLOCK_V)
):
    row = tl.program_id(0).to(tl.int64)
    probs = probs_ptr + row * stride_probs
    offs_v = tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    offs_b = tl.arange(0, NUM_BLOCKS)
    blocks = tl.cdiv(vocab, BLOCK_V)
    # masses[b], squares[b]: Σ q and Σ q² of block b's columns not yet drawn
    masses = tl.zeros([NUM_BLOCKS], dtype=tl.float32)
    squares = tl.zeros([NUM_BLOCKS], dtype=tl.float32)
    for b in range(0, blocks):
        ys = b * BLOCK_V + offs_v
        q = tl.load(probs + ys, mask=ys < vocab, other=0.0)
        masses = tl.where(offs_b == b, tl.sum(q, axis=0), masses)
        squares = tl.where(offs_b == b, tl.sum(q * q, axis=0), squares)
    taken = tl.zeros([BLOCK_K], dtype=tl.int64) - 1  # the columns drawn so far
    bound = tl.sum(masses * 0.0, axis=0) + first_score
    for i in tl.static_range(K):
        mass = tl.sum(masses, axis=0)
        live = mass > 0
        if i > 0:
            bound = tl.minimum(bound, tl.sum(squares, axis=0) / tl.maximum(mass, 1e-30))
        bound = tl.where(live, bound, 0.0)
        threshold = tl.load(coins_ptr + row * stride_coins + i) * mass
        # the block: the first whose cumulative mass passes the threshold, or (rounding) the
        # last that has any; its carry from the same cumulative sums, so that carry <= threshold
        cumulative = tl.cumsum(masses, axis=0)
        passed = tl.sum(((cumulative <= threshold) & (offs_b < blocks)).to(tl.int32), axis=0)
        last_block = tl.max(tl.where(masses > 0, offs_b, 0), axis=0)
        block = tl.minimum(passed, last_block)
        carry = tl.sum(tl.where(offs_b == block - 1, cumulative, 0.0), axis=0)
        ys = block.to(tl.int64) * BLOCK_V + offs_v
        ok = ys < vocab
        q = tl.load(probs + ys, mask=ok, other=0.0)
        q = tl.where(_removed(ys, taken, offs_k, i, K) | ~ok, 0.0, q)
        _, count, last_nonzero = inverse_cdf_block(q, ys, ok, threshold, carry, row * 0, row * 0)
        column = tl.minimum(block.to(tl.int64) * BLOCK_V + count, last_nonzero)
        tl.store(columns_ptr + row * K + i, column)
        tl.store(scores_ptr + row * K + i, bound)
        taken = tl.where(offs_k == i, column, taken)
        left = tl.where(ys == column, 0.0, q)
        masses = tl.where(offs_b == block, tl.sum(left, axis=0), masses)
        squares = tl.where(offs_b == block, tl.sum(left * left, axis=0), squares)


@triton.jit
def _removed(ys, taken, offs_k, count, K: tl.constexpr):
    """Whether each of ``ys`` is among the first ``count`` drawn columns."""
    hit = ys < 0  # all false
    for j in tl.static_range(K):
        if j < count:  # both compile-time constants
            hit = hit | (ys == pick(taken, offs_k, j))
    return hit


@triton.jit
def inverse_cdf_block(values, ys, ok, threshold, carry, count, last_nonzero):
    """One block of ``domain.sampling.sample_from_probs``'s scan over a row's ``values`` at
    columns ``ys`` (``ok`` inside the row): the running sum ``carry`` of the blocks before,
    ``count`` of cumulative sums at most ``threshold`` (the sample's index, once every block is
    scanned) and the last column of non-zero value, the index's bound → the three updated."""
    values = tl.where(ok, values, 0.0)
    cdf = carry + tl.cumsum(values, axis=0)
    count += tl.sum(((cdf <= threshold) & ok).to(tl.int64), axis=0)
    nonzero = tl.max(tl.where(values > 0, ys, 0), axis=0).to(tl.int64)
    return tl.max(cdf, axis=0), count, tl.maximum(last_nonzero, nonzero)  # cdf: non-decreasing


def row_block(vocab: int, block_v: int) -> int:
    """The columns a scan over a row of ``vocab`` reads at once: at most ``block_v``, a power
    of two, at least 16."""
    block: int = min(block_v, max(16, triton.next_power_of_2(vocab)))
    return block


def vocab_blocks(vocab: int, block_v: int) -> tuple[int, int]:
    """A row scan's columns a block (``row_block``) and the register vector that holds one sum
    per block (a power of two, at least 16)."""
    block = row_block(vocab, block_v)
    return block, max(16, triton.next_power_of_2(triton.cdiv(vocab, block)))


def draw_children(
    probs: torch.Tensor, coins: torch.Tensor, *, block_v: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """``domain.tree_sampling.draw_children`` in one launch; the same arguments and result.
    Rows of ``probs`` and ``coins`` may be strided (a depth's rows of a drawn chain's block, a
    depth's column of the step's coins): read in place where their columns are adjacent, no
    copy launched. ``block_v``: the vocabulary's columns a pass reads at once (tests shrink it
    to cross blocks)."""
    rows, k = coins.shape
    vocab = probs.shape[1]
    device = probs.device
    # every (row, draw) is written
    columns = torch.empty((rows, k), dtype=torch.int64, device=device)
    scores = torch.empty((rows, k), dtype=torch.float32, device=device)
    if rows == 0:
        return columns, scores
    block, num_blocks = vocab_blocks(vocab, block_v)
    probs, coins = unit_columns(probs.float()), unit_columns(coins.float())
    _draw_children_kernel[(rows,)](
        probs,
        coins,
        columns,
        scores,
        vocab,
        probs.stride(0),
        coins.stride(0),
        FIRST_DRAW_SCORE,
        K=k,
        BLOCK_K=max(16, triton.next_power_of_2(k)),
        BLOCK_V=block,
        NUM_BLOCKS=num_blocks,
        num_warps=4,
    )
    return columns, scores


def unit_columns(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` (rows, C) as they are where their columns are adjacent (a kernel then reads
    them at their row stride), else a contiguous copy."""
    return rows if rows.stride(1) == 1 or rows.shape[1] == 1 else rows.contiguous()


def sample_from_probs(
    probs: torch.Tensor, coins: torch.Tensor, *, block_v: int = 1024
) -> torch.Tensor:
    """``domain.sampling.sample_from_probs`` in one launch: ``probs`` (rows, V) non-negative,
    ``coins`` (rows,) → (rows,) int64. A row's sample is the first of its drawn children, so
    this is the draws' kernel with one child a row: two passes over the vocabulary where the
    reference's scan takes a cumulative sum over the whole (rows, V) (41 µs of a plain step's
    0.45 ms at bs 64 on the H100) and five more launches."""
    columns, _ = draw_children(probs, coins.unsqueeze(1), block_v=block_v)
    return columns[:, 0]
