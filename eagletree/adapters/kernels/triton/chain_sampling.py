"""Triton: speculative sampling along chains of drawn drafts in two launches
(``domain.chain_sampling.verify_chain_drawn`` semantics).

The drawn trees' walk (``tree_sampling``) verifies a chain as a tree of width one, one program a
request walking its depths in turn; each depth it visits reads the vocabulary once or twice and
the bonus twice more, a pass at a time: 60 µs for a chain S3 at bs 64 on the H100's real pair,
the largest share of what sampling adds to the step. A chain needs less: a depth's acceptance
reads two numbers (p and q at its draft), and the bonus is drawn from one row, the residual
max(0, p − q) where the chain stopped or the target after its last draft. So the first launch
sums every depth's residual and target row per block of the vocabulary, a program each (all
rows, all blocks at once: bs · (S + 1) · V / BLOCK_V programs); the second walks each chain's
acceptances, finds the block the bonus coin falls in from the stopping row's block sums and
scans that block alone.

Per element as the reference; sums run in another order, so a bonus coin within a rounding of a
token's cumulative edge may take its neighbour (never a token the row gives no mass). No host
sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.draw_children import (
    inverse_cdf_block,
    unit_columns,
    vocab_blocks,
)
from eagletree.domain.tree_sampling import draft_columns
from eagletree.domain.verify import VerifyResult


@triton.jit
def _residual_block(
    target_row, draft_row, column_of_ptr, ys, ok, drafted, HAS_MAP: tl.constexpr
):  # fmt: skip
    """At target ids ``ys`` (masked by ``ok``): the target's probabilities, and the residual
    max(0, p − q) where the row has a draft (``drafted``), else the target's again."""
    p = tl.load(target_row + ys, mask=ok, other=0.0)
    if HAS_MAP:
        column = tl.load(column_of_ptr + ys, mask=ok, other=-1)
        q = tl.load(draft_row + column, mask=ok & (column >= 0) & drafted, other=0.0)
    else:
        q = tl.load(draft_row + ys, mask=ok & drafted, other=0.0)
    return p, tl.where(drafted, tl.maximum(p - q, 0.0), p)


@triton.jit
def _chain_block_sums_kernel(
    target_ptr,  # (bs, S + 1, V) float32
    draft_ptr,  # (bs, S, V_draft) float32
    column_of_ptr,  # (V,) int64 target id -> draft column, −1 outside (HAS_MAP)
    sums_ptr,  # (bs, S + 1, 2, num_blocks) float32 out: Σ residual, Σ target a block
    vocab,
    draft_vocab,
    num_steps,
    num_blocks,
    HAS_MAP: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # request · (S + 1) + depth
    block = tl.program_id(1)
    depth = row % (num_steps + 1)
    request = row // (num_steps + 1)
    ys = block * BLOCK_V + tl.arange(0, BLOCK_V)
    ok = ys < vocab
    drafted = depth < num_steps  # the last row (after the last draft) has none
    draft_row = draft_ptr + (request * num_steps + tl.minimum(depth, num_steps - 1)) * draft_vocab
    p, residual = _residual_block(
        target_ptr + row * vocab, draft_row, column_of_ptr, ys, ok, drafted, HAS_MAP
    )
    out = sums_ptr + row * 2 * num_blocks + block
    tl.store(out, tl.sum(residual, axis=0))
    tl.store(out + num_blocks, tl.sum(p, axis=0))


@triton.jit
def _chain_walk_kernel(
    candidates_ptr,  # (bs, S + 1) int64
    target_ptr,  # (bs, S + 1, V) float32
    draft_ptr,  # (bs, S, V_draft) float32
    column_of_ptr,  # (V,) int64 (HAS_MAP)
    sums_ptr,  # (bs, S + 1, 2, num_blocks) float32
    coins_ptr,  # (bs, S) float32, unit column stride
    bonus_ptr,  # (bs,) float32
    predict_ptr,  # (bs · (S + 1),) int32 out
    accept_index_ptr,  # (bs, S + 1) int32 out
    accept_length_ptr,  # (bs,) int32 out
    vocab,
    draft_vocab,
    num_steps,
    num_blocks,
    stride_coins,
    stride_bonus,
    HAS_MAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,  # a power of two at least num_blocks
):
    req = tl.program_id(0).to(tl.int64)
    n = num_steps + 1
    # the drafts accepted: each while its coin · q(x) < p(x) (every depth's three numbers read:
    # a branch per depth costs more than the loads)
    length = req * 0
    active = length == 0
    for depth in range(0, num_steps):
        x = tl.load(candidates_ptr + req * n + depth + 1)
        p_x = tl.load(target_ptr + (req * n + depth) * vocab + x)
        column = x
        if HAS_MAP:
            column = tl.load(column_of_ptr + x)
        q_row = draft_ptr + (req * num_steps + depth) * draft_vocab
        q_x = tl.load(q_row + tl.maximum(column, 0), mask=column >= 0, other=0.0)
        active = active & (tl.load(coins_ptr + req * stride_coins + depth) * q_x < p_x)
        length += active.to(tl.int64)
    # the bonus's row: the residual where the chain stopped, the target after a whole chain;
    # a residual with no mass (p <= q everywhere there) is never reached by a rejection (unless
    # p has less mass than q, a padding row's): the target's then
    row = req * n + length
    offs_b = tl.arange(0, NUM_BLOCKS)
    in_row = offs_b < num_blocks
    sums_row = sums_ptr + row * 2 * num_blocks + offs_b
    residual_sums = tl.load(sums_row, mask=in_row, other=0.0)
    drafted = (length < num_steps) & (tl.sum(residual_sums, axis=0) > 0)
    sums = tl.where(drafted, residual_sums, tl.load(sums_row + num_blocks, mask=in_row, other=0.0))
    threshold = tl.load(bonus_ptr + req * stride_bonus) * tl.sum(sums, axis=0)
    # the block the coin falls in: the first whose running sum passes the threshold, or, where
    # rounding leaves the coin past every block's, the last with any mass
    running = tl.cumsum(sums, axis=0)
    block = tl.sum(((running <= threshold) & in_row).to(tl.int32), axis=0)
    block = tl.minimum(block, tl.max(tl.where(sums > 0, offs_b, -1), axis=0))
    offs_v = tl.arange(0, BLOCK_V)
    ys = tl.maximum(block, 0) * BLOCK_V + offs_v
    ok = (ys < vocab) & (block >= 0)
    q_row = draft_ptr + (req * num_steps + tl.minimum(length, num_steps - 1)) * draft_vocab
    _, values = _residual_block(
        target_ptr + row * vocab, q_row, column_of_ptr, ys, ok, drafted, HAS_MAP
    )
    carry = tl.sum(tl.where(offs_b < block, sums, 0.0), axis=0)
    _, count, last_nonzero = inverse_cdf_block(values, ys, ok, threshold, carry, req * 0, req * 0)
    # a threshold the block's own scan rounds past (or past every block): its last token with
    # mass
    in_block = tl.sum(ok.to(tl.int64), axis=0)
    start = tl.maximum(block, 0).to(tl.int64) * BLOCK_V
    bonus = tl.where(count >= in_block, last_nonzero, start + count)
    bonus = tl.where(block >= 0, bonus, 0)  # a row with no mass at all: token 0
    # node i < length predicts draft i + 1, node length the bonus; the path is nodes 0..length
    offs = tl.arange(0, BLOCK_N)
    nodes = offs < n
    drafts = tl.load(candidates_ptr + req * n + offs + 1, mask=offs < num_steps, other=-1)
    predict = tl.where(offs < length, drafts, tl.where(offs == length, bonus, -1))
    tl.store(predict_ptr + req * n + offs, predict.to(tl.int32), mask=nodes)
    path = tl.where(offs <= length, req * n + offs, -1)
    tl.store(accept_index_ptr + req * n + offs, path.to(tl.int32), mask=nodes)
    tl.store(accept_length_ptr + req, length.to(tl.int32))


def verify_chain_drawn(
    candidates: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    coins: torch.Tensor,
    bonus_coins: torch.Tensor,
    token_ids: torch.Tensor | None = None,
    *,
    block_v: int = 1024,
) -> VerifyResult:
    """``domain.chain_sampling.verify_chain_drawn`` in two launches; the same arguments and
    result. ``block_v``: the vocabulary's columns a program sums (tests shrink it to cross
    blocks)."""
    bs, n = candidates.shape
    num_steps = n - 1
    device = candidates.device
    vocab = target_probs.shape[-1]
    predict = torch.empty((bs * n,), dtype=torch.int32, device=device)
    accept_index = torch.empty((bs, n), dtype=torch.int32, device=device)
    accept_length = torch.empty((bs,), dtype=torch.int32, device=device)
    if bs == 0:
        return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)
    # without a map the kernel reads no column (HAS_MAP off): any int64 tensor will do
    column_of = candidates if token_ids is None else draft_columns(token_ids, vocab)
    block, num_blocks_pow2 = vocab_blocks(vocab, block_v)
    num_blocks = triton.cdiv(vocab, block)
    target = target_probs.float().contiguous()
    draft = draft_probs.float().contiguous()
    # the step's coins in place: a column block and a column of its (bs, coins) tensor
    coins, bonus_coins = unit_columns(coins.float()), bonus_coins.float()
    sums = torch.empty((bs, n, 2, num_blocks), dtype=torch.float32, device=device)
    _chain_block_sums_kernel[(bs * n, num_blocks)](
        target,
        draft,
        column_of,
        sums,
        vocab,
        draft.shape[2],
        num_steps,
        num_blocks,
        HAS_MAP=token_ids is not None,
        BLOCK_V=block,
        num_warps=4,
    )
    _chain_walk_kernel[(bs,)](
        candidates.contiguous(),
        target,
        draft,
        column_of,
        sums,
        coins,
        bonus_coins,
        predict,
        accept_index,
        accept_length,
        vocab,
        draft.shape[2],
        num_steps,
        num_blocks,
        coins.stride(0),
        bonus_coins.stride(0),
        HAS_MAP=token_ids is not None,
        BLOCK_N=max(16, triton.next_power_of_2(n)),
        BLOCK_V=block,
        NUM_BLOCKS=num_blocks_pow2,
        num_warps=4,
    )
    return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)
