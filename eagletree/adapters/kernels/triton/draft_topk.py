"""Triton: the k most likely tokens of each row and their softmax probabilities, in two launches.

``domain.sampling.top_k_probs`` is the reference (a softmax over the whole vocabulary, then a
top-k): over a 128k vocabulary and a handful of rows both torch kernels run on a few blocks and
take tens of microseconds each. Here the vocabulary is cut into chunks, one program per (row,
chunk), each writing its chunk's max, its sum of exp(x − max) and its own top k; a second
launch, one program per row, merges the chunks' sums (log-sum-exp) and candidates. Ties go to
the lower column, as in the reference; probabilities differ from its softmax by rounding only
(another summation order). Given a draft's column → target id map, the merge stores the mapped
ids: no launch of its own for the map. No host sync.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class TopKConfig(NamedTuple):
    chunk: int  # vocabulary entries per first-stage program
    num_warps: int


def default_config(rows: int, vocab: int) -> TopKConfig:
    """The H200 sweep's choice (``benchmarks/draft_topk.py``): from ~4M logits on (32 rows of
    a 128k vocabulary, 128 of a 32k one) chunks of 512 entries on one warp, 1.2–1.3× faster
    than 4096 on 8 — a one-warp program reduces by shuffles alone, with no block barrier per
    round of the top-k, and the many small programs still fill the machine. Fewer logits
    leave too few such programs; there 4096 on 8 warps is best or within 13 %."""
    if rows * vocab >= 4_000_000:
        return TopKConfig(chunk=512, num_warps=1)
    return TopKConfig(chunk=4096, num_warps=8)


@triton.jit
def _top_k_in_chunk(values, index, valid, K: tl.constexpr, BLOCK_K: tl.constexpr):
    # the K largest of ``values`` (ties: lower index) → (values (BLOCK_K,), indices (BLOCK_K,)
    # int32, −1 where fewer than K entries are valid); ``index`` int32 (chunk offsets or token
    # ids): each round's argmin then moves half the registers and shuffles of an int64 one
    NONE: tl.constexpr = 2**31 - 1  # above every index: the argmin's identity
    offs_k = tl.arange(0, BLOCK_K)
    best_v = tl.full([BLOCK_K], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK_K], -1, tl.int32)
    remaining = tl.where(valid, values, float("-inf"))
    taken = ~valid
    for j in tl.static_range(K):
        top = tl.max(tl.where(taken, float("-inf"), remaining), axis=0)
        # lowest index holding the maximum among the entries not yet taken
        is_top = (~taken) & (remaining == top)
        top_i = tl.min(tl.where(is_top, index, NONE), axis=0)
        best_v = tl.where(offs_k == j, top, best_v)
        best_i = tl.where(offs_k == j, top_i, best_i)
        taken = taken | (index == top_i)
    return best_v, tl.where(best_i == NONE, -1, best_i)


@triton.jit
def _chunk_kernel(
    logits_ptr,
    stride_row,
    part_max_ptr,  # (rows, chunks)
    part_sum_ptr,  # (rows, chunks)
    part_v_ptr,  # (rows, chunks, BLOCK_K)
    part_i_ptr,  # (rows, chunks, BLOCK_K) int32 token ids, −1 for none
    vocab,
    num_chunks,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * CHUNK  # int32: the launcher keeps token ids below 2**31
    offs = tl.arange(0, CHUNK)
    valid = start + offs < vocab
    x = tl.load(logits_ptr + row * stride_row + start + offs, mask=valid, other=float("-inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp(x - m_safe), axis=0)  # 0 for a chunk of −inf only
    # the rounds run on chunk offsets; only the K winners become token ids
    best_v, best_i = _top_k_in_chunk(x, offs, valid, K, BLOCK_K)
    best_i = tl.where(best_i >= 0, start + best_i, -1)
    part = row * num_chunks + tl.program_id(1)
    tl.store(part_max_ptr + part, m)
    tl.store(part_sum_ptr + part, total)
    offs_k = tl.arange(0, BLOCK_K)
    tl.store(part_v_ptr + part * BLOCK_K + offs_k, best_v)
    tl.store(part_i_ptr + part * BLOCK_K + offs_k, best_i)


@triton.jit
def _merge_kernel(
    part_max_ptr,
    part_sum_ptr,
    part_v_ptr,
    part_i_ptr,
    probs_ptr,  # (rows, K) float32 out
    tokens_ptr,  # (rows, K) int64 out
    token_ids_ptr,  # (V,) int64 target id of each column; read only if MAP_TOKENS
    num_chunks,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    MAP_TOKENS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    chunk_ok = offs_c < num_chunks
    m = tl.load(part_max_ptr + row * num_chunks + offs_c, mask=chunk_ok, other=float("-inf"))
    s = tl.load(part_sum_ptr + row * num_chunks + offs_c, mask=chunk_ok, other=0.0)
    big_m = tl.max(m, axis=0)
    big_m_safe = tl.where(big_m == float("-inf"), 0.0, big_m)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - big_m_safe))
    total = tl.sum(s * scale, axis=0)
    # every chunk's candidates: (BLOCK_C · BLOCK_K,) values and int32 columns
    offs = tl.arange(0, BLOCK_C * BLOCK_K)
    cand_ok = (offs // BLOCK_K) < num_chunks
    base = row * num_chunks * BLOCK_K
    values = tl.load(part_v_ptr + base + offs, mask=cand_ok, other=float("-inf"))
    columns = tl.load(part_i_ptr + base + offs, mask=cand_ok, other=-1)
    cand_ok = cand_ok & (columns >= 0)
    best_v, best = _top_k_in_chunk(values, columns, cand_ok, K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    out_ok = offs_k < K
    p = tl.where(best_v == float("-inf"), 0.0, tl.exp(best_v - big_m_safe) / total)
    tl.store(probs_ptr + row * K + offs_k, p, mask=out_ok)
    if MAP_TOKENS:
        tokens = tl.load(token_ids_ptr + best, mask=out_ok & (best >= 0), other=-1)
    else:
        tokens = best.to(tl.int64)
    tl.store(tokens_ptr + row * K + offs_k, tokens, mask=out_ok)


def top_k_probs(
    logits: torch.Tensor,
    k: int,
    token_ids: torch.Tensor | None = None,
    *,
    config: TopKConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``domain.sampling.top_k_probs`` in two launches: (probs (rows, k) f32, tokens (rows, k)
    int64, mapped through ``token_ids`` when given); ``config`` defaults to
    ``default_config(rows, vocab)``."""
    # logits: (rows, V), rows contiguous; token_ids: (V,) int64 or None
    rows, vocab = logits.shape
    assert 1 <= k <= vocab and logits.stride(1) == 1
    if token_ids is not None:
        assert token_ids.shape == (vocab,) and token_ids.dtype == torch.int64
        assert token_ids.device == logits.device and token_ids.stride(0) == 1
    device = logits.device
    probs = torch.empty(rows, k, dtype=torch.float32, device=device)
    tokens = torch.empty(rows, k, dtype=torch.int64, device=device)
    if rows == 0:
        return probs, tokens
    config = default_config(rows, vocab) if config is None else config
    chunk = min(config.chunk, max(16, triton.next_power_of_2(vocab)))
    num_chunks = triton.cdiv(vocab, chunk)
    assert num_chunks * chunk < 2**31  # the kernels' token ids are int32
    block_k = max(2, triton.next_power_of_2(k))
    part_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=device)
    part_sum = torch.empty_like(part_max)
    part_v = torch.empty(rows, num_chunks, block_k, dtype=torch.float32, device=device)
    part_i = torch.empty(rows, num_chunks, block_k, dtype=torch.int32, device=device)
    _chunk_kernel[(rows, num_chunks)](
        logits, logits.stride(0), part_max, part_sum, part_v, part_i, vocab, num_chunks,
        K=k, BLOCK_K=block_k, CHUNK=chunk, num_warps=config.num_warps,
    )  # fmt: skip
    _merge_kernel[(rows,)](
        part_max, part_sum, part_v, part_i, probs, tokens,
        tokens if token_ids is None else token_ids,  # unread without a map
        num_chunks,
        K=k, BLOCK_K=block_k, BLOCK_C=max(2, triton.next_power_of_2(num_chunks)),
        MAP_TOKENS=token_ids is not None,
    )  # fmt: skip
    return probs, tokens
