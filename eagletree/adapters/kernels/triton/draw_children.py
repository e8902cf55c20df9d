"""Triton: a drawn node's children, k draws without replacement, one program per row
(``domain.tree_sampling.draw_children`` semantics).

The torch reference takes about fifteen small kernels a draw (the mass left, the inverse CDF,
the score, the removal), k draws a beam row: hundreds of launches a drawn tree step. Here a
program draws its row's k children in turn, each with two passes over the vocabulary (the
mass and the Σ q² the earlier draws left, then the inverse-CDF scan against coin · that
mass). Per-element arithmetic as the reference; its sums run in
another order, so a coin within a rounding of a token's cumulative edge may pick the
neighbour. No host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.tree_verify import pick
from eagletree.domain.tree_sampling import FIRST_DRAW_SCORE


@triton.jit
def _draw_children_kernel(
    probs_ptr,  # (rows, V) float32
    coins_ptr,  # (rows, K) float32
    columns_ptr,  # (rows, K) int64 out
    drawn_ptr,  # (rows, K) float32 out
    scores_ptr,  # (rows, K) float32 out
    vocab,
    first_score,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    probs = probs_ptr + row * vocab
    offs_v = tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    taken = tl.zeros([BLOCK_K], dtype=tl.int64) - 1  # the columns drawn so far
    bound = tl.sum(tl.zeros([BLOCK_V], dtype=tl.float32), axis=0) + first_score
    for i in tl.static_range(K):
        masses = tl.zeros([BLOCK_V], dtype=tl.float32)
        squares = tl.zeros([BLOCK_V], dtype=tl.float32)
        for start in range(0, vocab, BLOCK_V):
            ys = start + offs_v
            q = tl.load(probs + ys, mask=ys < vocab, other=0.0)
            q = tl.where(_removed(ys, taken, offs_k, i, K), 0.0, q)
            masses += q
            squares += q * q
        mass = tl.sum(masses, axis=0)
        live = mass > 0
        if i > 0:
            bound = tl.minimum(bound, tl.sum(squares, axis=0) / tl.maximum(mass, 1e-30))
        bound = tl.where(live, bound, 0.0)
        threshold = tl.load(coins_ptr + row * K + i) * mass
        carry = mass * 0.0
        count = row * 0
        last_nonzero = row * 0
        for start in range(0, vocab, BLOCK_V):
            ys = start + offs_v
            ok = ys < vocab
            q = tl.load(probs + ys, mask=ok, other=0.0)
            q = tl.where(_removed(ys, taken, offs_k, i, K) | ~ok, 0.0, q)
            carry, count, last_nonzero = inverse_cdf_block(
                q, ys, ok, threshold, carry, count, last_nonzero
            )
        column = tl.minimum(count, last_nonzero)
        q_x = tl.where(live, tl.load(probs + column), 0.0)
        tl.store(columns_ptr + row * K + i, column)
        tl.store(drawn_ptr + row * K + i, q_x)
        tl.store(scores_ptr + row * K + i, bound)
        taken = tl.where(offs_k == i, column, taken)


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


def draw_children(
    probs: torch.Tensor, coins: torch.Tensor, *, block_v: int = 1024
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``domain.tree_sampling.draw_children`` in one launch; the same arguments and result.
    ``block_v``: the vocabulary's columns a pass reads at once (tests shrink it to cross
    blocks)."""
    rows, k = coins.shape
    vocab = probs.shape[1]
    device = probs.device
    columns = torch.zeros((rows, k), dtype=torch.int64, device=device)
    drawn = torch.zeros((rows, k), dtype=torch.float32, device=device)
    scores = torch.zeros((rows, k), dtype=torch.float32, device=device)
    if rows == 0:
        return columns, drawn, scores
    _draw_children_kernel[(rows,)](
        probs.float().contiguous(),
        coins.float().contiguous(),
        columns,
        drawn,
        scores,
        vocab,
        FIRST_DRAW_SCORE,
        K=k,
        BLOCK_K=max(16, triton.next_power_of_2(k)),
        BLOCK_V=min(block_v, max(16, triton.next_power_of_2(vocab))),
        num_warps=4,
    )
    return columns, drawn, scores
