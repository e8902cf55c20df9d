"""Triton: the per-block steps of pool attention — row loads, one online-softmax step, tree bits.

Device functions inlined into ``pool_attention_kernel._pool_attention_kernel``. Scores are fp32
and in log2 units (``exp2`` is the fast exponential); a logit cap works on natural units first.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def load_rows(rows, D: tl.constexpr, BLOCK_D: tl.constexpr, row_valid, MASKED: tl.constexpr):
    """(len(rows), BLOCK_D) block of the rows at pointers ``rows``; masks only what can be out."""
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = rows[:, None] + offs_d[None, :]
    if MASKED:
        if BLOCK_D == D:
            block = tl.load(ptrs, mask=row_valid[:, None], other=0.0)
        else:
            block = tl.load(ptrs, mask=row_valid[:, None] & (offs_d[None, :] < D), other=0.0)
    elif BLOCK_D == D:
        block = tl.load(ptrs)
    else:
        block = tl.load(ptrs, mask=offs_d[None, :] < D, other=0.0)
    return block


@triton.jit
def attend_block(
    m_i,
    l_i,
    acc,
    qa,
    qb,
    k_rows,  # (BLOCK_N,) pointers to the keys' K rows at this kv head
    v_rows,  # (BLOCK_N,) pointers to their V rows (unused with V_FROM_K)
    key_valid,  # (BLOCK_N,) keys that exist (MASKED only)
    visible,  # (BLOCK_M, BLOCK_N): which row sees which key (MASKED only)
    score_scale,  # scores → log2 units (after the cap, if any)
    cap_in,  # cap: s ↦ cap_out · tanh(s · cap_in)
    cap_out,
    DA: tl.constexpr,
    DB: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DA: tl.constexpr,
    BLOCK_DB: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    MASKED: tl.constexpr,
    V_FROM_K: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_CAP: tl.constexpr,
):
    """One online-softmax step over a block of keys → updated (m_i, l_i, acc), in log2 units."""
    ka = load_rows(k_rows, DA, BLOCK_DA, key_valid, MASKED).to(qa.dtype)
    s = tl.dot(qa, tl.trans(ka), input_precision=PRECISION)
    if BLOCK_DB > 0:
        kb = load_rows(k_rows + DA, DB, BLOCK_DB, key_valid, MASKED).to(qa.dtype)
        s += tl.dot(qb, tl.trans(kb), input_precision=PRECISION)
    if HAS_CAP:
        s = cap_out * _tanh(s * cap_in)
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    # score_scale > 0 commutes with max: scale the row max, then scale and shift in one FMA
    m_new = tl.maximum(m_i, tl.max(s, 1) * score_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s * score_scale - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if V_FROM_K:  # noqa: SIM108 - a constexpr branch, not a runtime select
        v = ka
    else:
        v = load_rows(v_rows, DV, BLOCK_DV, key_valid, MASKED).to(qa.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def tree_visible(
    bits_ptr, node, row_valid, width, c0, cols, BLOCK_M: tl.constexpr, WORDS: tl.constexpr
):
    """(BLOCK_M, BLOCK_N) bool: row r's tree node ``node[r]`` sees tail key ``cols[c]``.

    A node's visibility is ``cdiv(width, 32)`` int32 words (bit c % 32 of word c // 32); a block
    aligned at ``c0`` spans ``WORDS`` of them, each loaded once per row.
    """
    words_per_node = (width + 31) // 32
    first = c0 // 32
    shift = cols % 32
    which = cols // 32 - first
    node_words = bits_ptr + node.to(tl.int64) * words_per_node + first
    hits = tl.zeros([BLOCK_M, cols.shape[0]], tl.int32)
    for w in tl.static_range(WORDS):
        word = tl.load(node_words + w, mask=row_valid & (first + w < words_per_node), other=0)
        bit = (word[:, None] >> shift[None, :]) & 1
        hits = hits | tl.where((which == w)[None, :], bit, 0)
    return hits != 0
