"""Triton: recursive rejection sampling over trees of drawn drafts, one program per request
(``domain.tree_sampling.verify_tree_drawn`` semantics).

The torch reference walks S depths × k children over whole (bs, V) rows: about twenty kernels
a child, a thousand for S = 6, k = 8, each touching the vocabulary. Here a program walks its
request's tree in registers and touches the vocabulary only where the rule needs it. A child
is accepted by comparing its coin with p_i(x) / q_i(x) at its one token x, and the residual
after i rejections is a pointwise function of p, q and the rejected tokens with one normaliser
per rejection, max(0, p_j − q_j) / Z_j: so a node costs one pass over the vocabulary (the mass
q has per block, for a drawing request: what is left after a rejection is those sums with the
rejected token's block read again), a rejected child a pass for its Z, and the bonus two (its
total, then the inverse CDF) — a few passes a depth where the reference makes dozens.
Same rounding per element as the reference; sums are taken in another order, so a coin within
a rounding of its threshold may fall the other way. No host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.draw_children import inverse_cdf_block, vocab_blocks
from eagletree.adapters.kernels.triton.tree_verify import pick
from eagletree.domain.tree_sampling import draft_columns
from eagletree.domain.verify import VerifyResult


@triton.jit
def _residual(
    ys,
    ok,
    p_row,
    q_row,
    column_of_ptr,
    xs,
    ms,
    zs,
    offs_k,
    rejected,
    drawn,
    K: tl.constexpr,
    HAS_MAP: tl.constexpr,
):
    """At target ids ``ys`` (masked by ``ok``): the residual after ``rejected`` rejections and
    what q has left there (0 at the rejected tokens)."""
    p = tl.load(p_row + ys, mask=ok, other=0.0)
    if HAS_MAP:
        column = tl.load(column_of_ptr + ys, mask=ok, other=-1)
        q = tl.load(q_row + column, mask=ok & (column >= 0), other=0.0)
    else:
        q = tl.load(q_row + ys, mask=ok, other=0.0)
    removed = ys < 0  # all false
    for j in tl.static_range(K):
        if j < rejected:  # a branch, not a select: a node's first child pays for none of it
            x_j = pick(xs, offs_k, j)
            m_j = pick(ms, offs_k, j)
            z_j = pick(zs, offs_k, j)
            remaining = tl.where(removed, 0.0, q)
            is_x = ys == x_j
            q_j = tl.where(drawn, remaining / tl.maximum(m_j, 1e-30), tl.where(is_x, 1.0, 0.0))
            left = tl.maximum(p - q_j, 0.0)
            p = tl.where(z_j > 0, left / tl.maximum(z_j, 1e-30), p)
            removed = removed | is_x
    return p, tl.where(removed, 0.0, q)


@triton.jit
def _verify_tree_drawn_kernel(
    candidates_ptr,  # (bs, N) int64
    parents_ptr,  # (bs, N) int64
    ranks_ptr,  # (bs, N) int64
    sources_ptr,  # (bs, N) int64
    target_ptr,  # (bs, N, V) float32
    draft_ptr,  # (bs, D, V_draft) float32
    column_of_ptr,  # (V,) int64 target id -> draft column, −1 outside (HAS_MAP)
    drawn_ptr,  # (bs,) int8
    coins_ptr,  # (bs, N − 1) float32
    bonus_ptr,  # (bs,) float32
    predict_ptr,  # (bs·N,) int32 out, −1 filled
    accept_index_ptr,  # (bs, S + 1) int32 out, −1 filled
    accept_length_ptr,  # (bs,) int32 out
    n,
    vocab,
    draft_rows,
    draft_vocab,
    num_steps,
    K: tl.constexpr,
    HAS_MAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,  # a power of two at least cdiv(vocab, BLOCK_V)
):
    req = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N).to(tl.int64)  # node indices are int64 scalars below
    valid = offs < n
    row = req * n + offs
    token = tl.load(candidates_ptr + row, mask=valid, other=-1).to(tl.int64)
    parent = tl.load(parents_ptr + row, mask=valid, other=-2).to(tl.int64)
    rank = tl.load(ranks_ptr + row, mask=valid, other=-2).to(tl.int64)
    source = tl.load(sources_ptr + row, mask=valid, other=0).to(tl.int64)
    drawn_flag = tl.load(drawn_ptr + req).to(tl.int32)
    drawn = drawn_flag != 0
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.arange(0, BLOCK_V)
    offs_b = tl.arange(0, NUM_BLOCKS)

    tl.store(accept_index_ptr + req * (num_steps + 1), (req * n).to(tl.int32))
    zero = req * 0  # loop-carried scalars are int64 throughout
    last = zero
    length = zero
    active = zero == 0
    rejected = zero  # at the node where the walk stopped
    xs = tl.zeros([BLOCK_K], dtype=tl.int64) - 1
    ms = tl.zeros([BLOCK_K], dtype=tl.float32)
    zs = tl.zeros([BLOCK_K], dtype=tl.float32)
    for depth in range(1, num_steps + 1):
        if active:
            p_row = target_ptr + (req * n + last) * vocab
            children = parent == last
            first = tl.max(tl.where(children & (rank == 0), offs, -1), axis=0)
            source_row = tl.maximum(pick(source, offs, first), 0)
            q_row = draft_ptr + (req * draft_rows + source_row) * draft_vocab
            rejected = zero
            xs = tl.zeros([BLOCK_K], dtype=tl.int64) - 1
            chosen = zero - 1
            # per block of target ids, the mass q has there (a drawing request's): read once a
            # node; a rejection takes its token's block again, without it
            masses = tl.zeros([NUM_BLOCKS], dtype=tl.float32)
            if drawn_flag != 0:
                for b in range(0, tl.cdiv(vocab, BLOCK_V)):
                    left = _block_mass(
                        b, offs_v, vocab, p_row, q_row, column_of_ptr, xs, ms, zs, offs_k,
                        rejected, drawn, K, HAS_MAP, BLOCK_V,
                    )  # fmt: skip
                    masses = tl.where(offs_b == b, left, masses)
            for r in tl.static_range(K):
                child = tl.max(tl.where(children & (rank == r), offs, -1), axis=0)
                if (chosen < 0) & (child >= 0):
                    # the mass q has left after the rejections so far
                    mass_r = tl.sum(masses, axis=0)
                    if drawn_flag == 0:
                        mass_r = mass_r * 0.0 + 1.0
                    if (mass_r > 0) | (drawn_flag == 0):
                        x = pick(token, offs, child)
                        at_x = offs_v * 0 + x
                        p_at, q_at = _residual(
                            at_x, offs_v == 0, p_row, q_row, column_of_ptr, xs, ms, zs,
                            offs_k, rejected, drawn, K, HAS_MAP,
                        )  # fmt: skip
                        p_x = pick(p_at, offs_v, 0)
                        q_x = pick(q_at, offs_v, 0)
                        q_x = tl.where(drawn, q_x / tl.maximum(mass_r, 1e-30), 1.0)
                        coin = tl.load(coins_ptr + req * (n - 1) + tl.maximum(child - 1, 0))
                        if coin * q_x < p_x:
                            chosen = child
                        else:
                            # the normaliser of the residual this rejection leaves
                            xs = tl.where(offs_k == rejected, x, xs)
                            ms = tl.where(offs_k == rejected, mass_r, ms)
                            total = tl.zeros([BLOCK_V], dtype=tl.float32)
                            for start in range(0, vocab, BLOCK_V):
                                ys = start + offs_v
                                ok = ys < vocab
                                p_y, q_y = _residual(
                                    ys, ok, p_row, q_row, column_of_ptr, xs, ms, zs, offs_k,
                                    rejected, drawn, K, HAS_MAP,
                                )  # fmt: skip
                                q_y = tl.where(
                                    drawn, q_y / tl.maximum(mass_r, 1e-30),
                                    tl.where(ys == x, 1.0, 0.0),
                                )  # fmt: skip
                                total += tl.where(ok, tl.maximum(p_y - q_y, 0.0), 0.0)
                            zs = tl.where(offs_k == rejected, tl.sum(total, axis=0), zs)
                            rejected += 1
                            if drawn_flag != 0:  # x's block, what the rejections leave of it
                                block = x // BLOCK_V
                                left = _block_mass(
                                    block, offs_v, vocab, p_row, q_row, column_of_ptr, xs, ms,
                                    zs, offs_k, rejected, drawn, K, HAS_MAP, BLOCK_V,
                                )  # fmt: skip
                                masses = tl.where(offs_b == block, left, masses)
            found = chosen >= 0
            next_token = tl.where(found, pick(token, offs, chosen), -1)
            tl.store(predict_ptr + req * n + last, next_token.to(tl.int32))
            node = tl.where(found, req * n + chosen, -1)
            tl.store(accept_index_ptr + req * (num_steps + 1) + depth, node.to(tl.int32))
            length += found.to(tl.int64)
            last = tl.where(found, chosen, last)
            active = found
    # the bonus: from the residual where the walk stopped, else from the target after the path
    p_row = target_ptr + (req * n + last) * vocab
    first = tl.max(tl.where((parent == last) & (rank == 0), offs, -1), axis=0)
    source_row = tl.maximum(pick(source, offs, first), 0)
    q_row = draft_ptr + (req * draft_rows + source_row) * draft_vocab
    rejected = tl.where(active, 0, rejected)
    total = _row_sum(
        p_row, q_row, column_of_ptr, xs, ms, zs, offs_k, offs_v, rejected, drawn, vocab, K,
        HAS_MAP, BLOCK_V,
    )  # fmt: skip
    if total <= 0:  # nothing left of the residual: nothing is ever rejected there
        rejected = zero
        total = _row_sum(
            p_row, q_row, column_of_ptr, xs, ms, zs, offs_k, offs_v, rejected, drawn, vocab, K,
            HAS_MAP, BLOCK_V,
        )  # fmt: skip
    threshold = tl.load(bonus_ptr + req) * total
    carry = total * 0.0
    count = zero
    last_nonzero = zero
    for start in range(0, vocab, BLOCK_V):
        ys = start + offs_v
        ok = ys < vocab
        p_y, _ = _residual(
            ys, ok, p_row, q_row, column_of_ptr, xs, ms, zs, offs_k, rejected, drawn, K, HAS_MAP
        )
        carry, count, last_nonzero = inverse_cdf_block(
            p_y, ys, ok, threshold, carry, count, last_nonzero
        )
    bonus = tl.minimum(count, last_nonzero)
    tl.store(predict_ptr + req * n + last, bonus.to(tl.int32))
    tl.store(accept_length_ptr + req, length.to(tl.int32))


@triton.jit
def _block_mass(
    block, offs_v, vocab, p_row, q_row, column_of_ptr, xs, ms, zs, offs_k, rejected, drawn,
    K: tl.constexpr, HAS_MAP: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Σ of what q has left in ``block`` of target ids after ``rejected`` rejections."""
    ys = block * BLOCK_V + offs_v
    _, left_q = _residual(
        ys, ys < vocab, p_row, q_row, column_of_ptr, xs, ms, zs, offs_k, rejected, drawn, K,
        HAS_MAP,
    )  # fmt: skip
    return tl.sum(left_q, axis=0)


@triton.jit
def _row_sum(
    p_row, q_row, column_of_ptr, xs, ms, zs, offs_k, offs_v, rejected, drawn, vocab,
    K: tl.constexpr, HAS_MAP: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Σ over the vocabulary of the residual after ``rejected`` rejections."""
    totals = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, vocab, BLOCK_V):
        ys = start + offs_v
        ok = ys < vocab
        p_y, _ = _residual(
            ys, ok, p_row, q_row, column_of_ptr, xs, ms, zs, offs_k, rejected, drawn, K, HAS_MAP
        )
        totals += tl.where(ok, p_y, 0.0)
    return tl.sum(totals, axis=0)


def verify_tree_drawn(
    candidates: torch.Tensor,
    parents: torch.Tensor,
    ranks: torch.Tensor,
    sources: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    drawn: torch.Tensor,
    coins: torch.Tensor,
    bonus_coins: torch.Tensor,
    num_steps: int,
    topk: int,
    token_ids: torch.Tensor | None = None,
    *,
    block_v: int = 1024,
) -> VerifyResult:
    """``domain.tree_sampling.verify_tree_drawn`` in one launch; the same arguments and result.
    ``block_v``: the vocabulary's columns a pass reads at once (tests shrink it to cross blocks)."""
    bs, n = candidates.shape
    device = candidates.device
    vocab = target_probs.shape[-1]
    predict = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    if bs == 0:
        return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)
    # without a map the kernel reads no column (HAS_MAP off): any int tensor will do
    column_of = predict if token_ids is None else draft_columns(token_ids, vocab)
    block, num_blocks = vocab_blocks(vocab, block_v)
    _verify_tree_drawn_kernel[(bs,)](
        candidates.contiguous(),
        parents.contiguous(),
        ranks.contiguous(),
        sources.contiguous(),
        target_probs.float().contiguous(),
        draft_probs.float().contiguous(),
        column_of,
        drawn.to(torch.int8).contiguous(),
        coins.float().contiguous(),
        bonus_coins.float().contiguous(),
        predict,
        accept_index,
        accept_length,
        n,
        vocab,
        draft_probs.shape[1],
        draft_probs.shape[2],
        num_steps,
        K=topk,
        HAS_MAP=token_ids is not None,
        BLOCK_N=max(16, triton.next_power_of_2(n)),
        BLOCK_K=max(16, triton.next_power_of_2(topk)),
        BLOCK_V=block,
        NUM_BLOCKS=num_blocks,
        num_warps=4,
    )
    return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)
