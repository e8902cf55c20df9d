"""Adapter: the Triton split-KV pool-attention kernel, launched by ``pool_attention``.

One kernel serves every forward mode. A program owns one tile of BLOCK_M query rows of one
request and one kv head — rows are (query token, q head of that kv head's group) pairs, so a
K/V block loaded once serves the whole GQA group (and, for verify and draft modes, every query of
the request) — and one split of the request's key range. Key j < L_b is the prefix key
``req_to_token[row, j]``; key L_b + c is tail key c (``metadata.TailKind`` says which slot and
whether a row sees it). The program walks its keys in three phases: full blocks of prefix keys,
which every row sees, with no mask at all; the prefix's ragged end (a key mask only); then the
few tail keys, in blocks aligned to the tail, with the mode's visibility (causal, tree bits,
branch) — so the tree mask costs one block per program, not one per prefix block. With one split
the program writes the normalised output; with several, it writes (o, log2-sum-exp) partials that
``split_merge.merge_splits`` combines.

Scores and the softmax are fp32; on CPU (the interpreter computes bf16 wrongly) and for fp32
inputs the dot operands are fp32 too, on the GPU fp16/bf16 operands feed the tensor cores with
fp32 accumulation. Slot and token offsets are int64 (slot · row stride passes 2³¹ in large pools).
"""

from __future__ import annotations

import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.attention_blocks import (
    LOG2E,
    attend_block,
    load_rows,
    tree_visible,
)


@triton.jit
def _pool_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    part_o_ptr,
    part_lse_ptr,
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    new_slots_ptr,  # (num_tokens,) slot of every new token (out_cache_loc)
    ancestor_ptr,  # BRANCH: (bs·k, depth) ancestor slots of every branch
    qo_indptr_ptr,  # RAGGED: (bs + 1,) token offsets
    tile_req_ptr,  # RAGGED: request of every tile, −1 past the last
    tile_idx_ptr,  # RAGGED: tile index inside its request
    tree_bits_ptr,  # TREE: (bs·N, cdiv(N, 32)) int32, bit c % 32 of word c // 32: sees node c
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_table,
    num_q_heads,
    sm_scale,
    logit_cap,
    num_splits,
    min_chunk,
    tiles_per_req,
    width,
    depth,
    DA: tl.constexpr,
    DB: tl.constexpr,
    DV: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DA: tl.constexpr,
    BLOCK_DB: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    TAIL: tl.constexpr,  # 1 CAUSAL, 2 TREE, 3 BRANCH
    TAIL_WORDS: tl.constexpr,  # TREE: bit words one block of BLOCK_N tail keys spans
    RAGGED: tl.constexpr,
    V_FROM_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_CAP: tl.constexpr,
    SPLIT: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # key positions and loop bounds are int32 (context lengths); addresses are int64
    if RAGGED:
        req = tl.load(tile_req_ptr + tile)
        if req < 0:
            return
        m_block = tl.load(tile_idx_ptr + tile).to(tl.int32)
        q_start = tl.load(qo_indptr_ptr + req)
        num_q = (tl.load(qo_indptr_ptr + req + 1) - q_start).to(tl.int32)
        tail_len = num_q
    else:
        req = tile // tiles_per_req
        m_block = tile % tiles_per_req
        q_start = req.to(tl.int64) * width
        num_q = width
        if TAIL == 3:  # noqa: SIM108 - a constexpr branch, not a runtime select
            tail_len = width * (depth + 1)
        else:
            tail_len = width

    # query rows of this tile: (token, head of the group) pairs, token-major
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < num_q * GROUP
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    q_rows = q_ptr + (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    qa = load_rows(q_rows, DA, BLOCK_DA, row_valid, True)
    if DOT_FP32:
        qa = qa.to(tl.float32)
    qb = qa  # MLA's rope columns, scored in a second dot
    if BLOCK_DB > 0:
        qb = load_rows(q_rows + DA, DB, BLOCK_DB, row_valid, True).to(qa.dtype)
    # scores go to log2 units (exp2 is the fast exponential); a cap works on natural units first
    if HAS_CAP:
        score_scale = 1.0
        cap_in = sm_scale / logit_cap
        cap_out = logit_cap * LOG2E
    else:
        score_scale = sm_scale * LOG2E
        cap_in = 1.0
        cap_out = 1.0
    k_head = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_ptr + kv_head.to(tl.int64) * stride_vh

    prefix_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    table_row = req_to_token_ptr + tl.load(req_pool_indices_ptr + req).to(tl.int64) * stride_table
    total = prefix_len + tail_len
    # the last key any row of this tile can see: tail keys are ordered so that a row never sees
    # a tail key of a later query (tree nodes follow their ancestors, branches are blocks)
    last_tok = tl.minimum((m_block * BLOCK_M + BLOCK_M - 1) // GROUP, num_q - 1).to(tl.int32)
    if TAIL == 3:
        visible_end = prefix_len + (last_tok + 1) * (depth + 1)
    else:
        visible_end = prefix_len + last_tok + 1
    chunk = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N
    chunk = tl.maximum(chunk, min_chunk).to(tl.int32)
    start = (split * chunk).to(tl.int32)
    end = tl.minimum(start + chunk, visible_end).to(tl.int32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)

    # phase 1: this split's full blocks of prefix keys; every row sees them all: no mask at all.
    # Each block's slots are loaded one block ahead, so that K/V addresses do not wait on a load
    # of the same iteration and the pipeliner can keep the next block's K/V in flight.
    full_end = start + tl.maximum(tl.minimum(end, prefix_len) - start, 0) // BLOCK_N * BLOCK_N
    next_slot = tl.load(table_row + start + offs_n, mask=start + offs_n < full_end, other=0)
    for start_n in range(start, full_end, BLOCK_N):
        slot = next_slot.to(tl.int64)
        ahead = start_n + BLOCK_N + offs_n
        next_slot = tl.load(table_row + ahead, mask=ahead < full_end, other=0)
        m_i, l_i, acc = attend_block(
            m_i, l_i, acc, qa, qb, k_head + slot * stride_ks, v_head + slot * stride_vs,
            offs_n, offs_n,
            score_scale, cap_in, cap_out, DA, DB, DV, BLOCK_DA, BLOCK_DB, BLOCK_DV,
            False, V_FROM_K, PRECISION, HAS_CAP,
        )  # fmt: skip

    # phase 2: the prefix's ragged end, seen by every row (a loop of at most one block, so that
    # its loads go through the pipeliner's async copies rather than registers)
    prefix_end = tl.minimum(end, prefix_len)
    for start_n in range(full_end, prefix_end, BLOCK_N):
        key_valid = start_n + offs_n < prefix_end
        slot = tl.load(table_row + start_n + offs_n, mask=key_valid, other=0).to(tl.int64)
        m_i, l_i, acc = attend_block(
            m_i, l_i, acc, qa, qb, k_head + slot * stride_ks, v_head + slot * stride_vs,
            key_valid, key_valid[None, :],
            score_scale, cap_in, cap_out, DA, DB, DV, BLOCK_DA, BLOCK_DB, BLOCK_DV,
            True, V_FROM_K, PRECISION, HAS_CAP,
        )  # fmt: skip

    # phase 3: this split's tail keys [tail_lo, tail_hi) in blocks aligned to the tail's start
    # (at most a block or two for verify and draft modes), visible as the mode says
    tail_lo = tl.maximum(start, prefix_len) - prefix_len
    tail_hi = end - prefix_len
    for c0 in range(tail_lo // BLOCK_N * BLOCK_N, tail_hi, BLOCK_N):
        cols = c0 + offs_n  # tail key indices
        in_tail = (cols >= tail_lo) & (cols < tail_hi)
        if TAIL == 3:
            branch = cols // (depth + 1)
            step = cols - branch * (depth + 1)
            own = step == depth
            ancestor = tl.load(
                ancestor_ptr + (q_start + branch).to(tl.int64) * depth + step,
                mask=in_tail & (step < depth),
                other=0,
            ).to(tl.int64)
            own_slot = tl.load(new_slots_ptr + q_start + branch, mask=in_tail & own, other=0)
            slot = tl.where(own, own_slot.to(tl.int64), ancestor)
            tail_ok = branch[None, :] == tok[:, None]
        else:
            slot = tl.load(new_slots_ptr + q_start + cols, mask=in_tail, other=0).to(tl.int64)
            if TAIL == 1:
                tail_ok = cols[None, :] <= tok[:, None]
            else:
                tail_ok = tree_visible(
                    tree_bits_ptr, q_start + tok, row_valid, width, c0, cols, BLOCK_M, TAIL_WORDS
                )
        m_i, l_i, acc = attend_block(
            m_i, l_i, acc, qa, qb, k_head + slot * stride_ks, v_head + slot * stride_vs,
            in_tail, in_tail[None, :] & tail_ok,
            score_scale, cap_in, cap_out, DA, DB, DV, BLOCK_DA, BLOCK_DB, BLOCK_DV,
            True, V_FROM_K, PRECISION, HAS_CAP,
        )  # fmt: skip

    seen = l_i > 0
    o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv[None, :] < DV
    if SPLIT:
        part = ((q_start + tok).to(tl.int64) * num_q_heads + head) * num_splits + split
        tl.store(
            part_o_ptr + part[:, None] * DV + offs_dv[None, :], o, mask=row_valid[:, None] & dv_ok
        )
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_valid)
    else:
        o_row = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(
            o_ptr + o_row[:, None] + offs_dv[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dv_ok,
        )
