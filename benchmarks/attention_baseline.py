# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-calls, allow-untyped-decorators
"""Benchmark baseline: the Triton attention path before issue 4's rework, frozen for comparison.

``benchmarks/attention.py --compare`` times this next to the current ``TritonAttentionBackend``
in one run. It is the kernel and backend of commit 0832b6f, copied verbatim but for names: the
tree mask is loaded and evaluated on every key block (prefix included), and tail slots are
selected per block. Kept so that the comparison recorded in docs/benchmarks.md can be rerun;
remove it together with ``--compare`` once the old kernel is no longer worth measuring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from eagletree.adapters.attention.metadata import (
    AttentionPlan,
    PlanBuffers,
    TailKind,
    plan_forward,
)
from eagletree.adapters.attention.pool_access import (
    KVCache,
    check_layer,
    current_plan,
    is_mla_pool,
    layer_kv_buffers,
    save_new_kv,
)
from eagletree.domain.tree import TreeMaskMode
from eagletree.ports.memory import MLAKVCache, ReqToTokenPool

if TYPE_CHECKING:
    from eagletree.domain.attention_layer import AttentionLayer
    from eagletree.domain.batch import ForwardBatch


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


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
    mask_ptr,  # TREE: flat uint8 tree mask
    mask_indptr_ptr,  # TREE: (bs + 1,) offsets of the requests' mask blocks
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
    MASK_FULL: tl.constexpr,
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
    q_row = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    offs_da = tl.arange(0, BLOCK_DA)
    qa = tl.load(
        q_ptr + q_row[:, None] + offs_da[None, :],
        mask=row_valid[:, None] & (offs_da[None, :] < DA),
        other=0.0,
    )
    if DOT_FP32:
        qa = qa.to(tl.float32)
    if BLOCK_DB > 0:
        offs_db = tl.arange(0, BLOCK_DB)
        qb = tl.load(
            q_ptr + q_row[:, None] + DA + offs_db[None, :],
            mask=row_valid[:, None] & (offs_db[None, :] < DB),
            other=0.0,
        ).to(qa.dtype)
    offs_dv = tl.arange(0, BLOCK_DV)

    prefix_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    table_row = tl.load(req_pool_indices_ptr + req).to(tl.int64) * stride_table
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

    if TAIL == 2:
        mask_start = tl.load(mask_indptr_ptr + req)
        if MASK_FULL:
            mask_row = mask_start + tok.to(tl.int64) * (prefix_len + width) + prefix_len
        else:
            mask_row = mask_start + tok.to(tl.int64) * width

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_valid = offs_n < end
        in_prefix = offs_n < prefix_len
        tail_idx = offs_n - prefix_len
        in_tail = key_valid & (offs_n >= prefix_len)
        prefix_slot = tl.load(
            req_to_token_ptr + table_row + offs_n, mask=key_valid & in_prefix, other=0
        ).to(tl.int64)
        if TAIL == 3:
            branch = tail_idx // (depth + 1)
            step = tail_idx - branch * (depth + 1)
            own = step == depth
            ancestor = tl.load(
                ancestor_ptr + (q_start + branch).to(tl.int64) * depth + step,
                mask=in_tail & (step < depth),
                other=0,
            ).to(tl.int64)
            own_slot = tl.load(new_slots_ptr + q_start + branch, mask=in_tail & own, other=0)
            tail_slot = tl.where(own, own_slot.to(tl.int64), ancestor)
        else:
            tail_slot = tl.load(new_slots_ptr + q_start + tail_idx, mask=in_tail, other=0)
        slot = tl.where(in_prefix, prefix_slot, tail_slot.to(tl.int64))

        k_row = slot * stride_ks + kv_head * stride_kh
        ka = tl.load(
            k_ptr + k_row[:, None] + offs_da[None, :],
            mask=key_valid[:, None] & (offs_da[None, :] < DA),
            other=0.0,
        ).to(qa.dtype)
        s = tl.dot(qa, tl.trans(ka), input_precision=PRECISION)
        if BLOCK_DB > 0:
            kb = tl.load(
                k_ptr + k_row[:, None] + DA + offs_db[None, :],
                mask=key_valid[:, None] & (offs_db[None, :] < DB),
                other=0.0,
            ).to(qa.dtype)
            s += tl.dot(qb, tl.trans(kb), input_precision=PRECISION)
        s = s * sm_scale
        if HAS_CAP:
            s = logit_cap * _tanh(s / logit_cap)

        visible = row_valid[:, None] & key_valid[None, :]
        if TAIL == 1:
            tail_ok = tail_idx[None, :] <= tok[:, None]
        elif TAIL == 2:
            tail_ok = (
                tl.load(
                    mask_ptr + mask_row[:, None] + tail_idx[None, :],
                    mask=visible & in_tail[None, :],
                    other=0,
                )
                != 0
            )
        else:
            tail_ok = branch[None, :] == tok[:, None]
        visible = visible & (in_prefix[None, :] | tail_ok)
        s = tl.where(visible, s * 1.4426950408889634, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_FROM_K:
            v = ka
        else:
            v = tl.load(
                v_ptr + (slot * stride_vs + kv_head * stride_vh)[:, None] + offs_dv[None, :],
                mask=key_valid[:, None] & (offs_dv[None, :] < DV),
                other=0.0,
            ).to(qa.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    seen = l_i > 0
    o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
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


@triton.jit
def _merge_splits_kernel(
    part_o_ptr,
    part_lse_ptr,
    o_ptr,
    num_rows,
    num_q_heads,
    num_splits,
    stride_ot,
    stride_oh,
    DV: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_valid = rows < num_rows
    offs_dv = tl.arange(0, BLOCK_DV)
    io_mask = row_valid[:, None] & (offs_dv[None, :] < DV)
    rows64 = rows.to(tl.int64)
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    for split in range(0, num_splits):
        part = rows64 * num_splits + split
        lse = tl.load(part_lse_ptr + part, mask=row_valid, other=float("-inf"))
        o = tl.load(part_o_ptr + part[:, None] * DV + offs_dv[None, :], mask=io_mask, other=0.0)
        m_new = tl.maximum(m_i, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        weight = tl.exp2(lse - m_safe)
        acc = acc * alpha[:, None] + o * weight[:, None]
        l_i = l_i * alpha + weight
        m_i = m_new
    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    token = rows64 // num_q_heads
    head = rows64 % num_q_heads
    o_row = token * stride_ot + head * stride_oh
    tl.store(
        o_ptr + o_row[:, None] + offs_dv[None, :], out.to(o_ptr.dtype.element_ty), mask=io_mask
    )


def block_dim(n: int) -> int:
    """Power-of-two block covering ``n`` columns, at least 16 (tl.dot's smallest operand)."""
    return max(16, triton.next_power_of_2(n)) if n > 0 else 0


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """Tile sizes and compilation switches of one launch."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dot_fp32: bool  # fp32 dot operands (CPU interpreter, fp32 inputs)
    min_chunk: int  # fewest keys one split handles (a multiple of block_n)


@dataclass(frozen=True, slots=True)
class QueryTiles:
    """Where the query tiles lie: fixed width (``tile_req is None``) or ragged (EXTEND)."""

    num_tiles: int
    tiles_per_req: int = 0  # fixed width: tiles of one request
    qo_indptr: torch.Tensor | None = None  # ragged: (bs + 1,) token offsets
    tile_req: torch.Tensor | None = None  # ragged: (num_tiles,) request, −1 past the last tile
    tile_idx: torch.Tensor | None = None  # ragged: (num_tiles,) tile index in its request


@dataclass(frozen=True, slots=True)
class TailKeys:
    """The tail keys of every request and how rows see them (``metadata.TailKind`` values)."""

    kind: int  # 1 CAUSAL, 2 TREE, 3 BRANCH
    width: int = 0  # queries per request (fixed width); 0 when ragged
    depth: int = 0  # BRANCH: ancestors per branch
    ancestor_slots: torch.Tensor | None = None  # BRANCH: (bs·k, depth)
    tree_mask: torch.Tensor | None = None  # TREE: flat bool
    mask_indptr: torch.Tensor | None = None  # TREE: (bs + 1,)
    mask_full: bool = True  # TREE: FULL_MASK rows (L_b + N long) or QLEN_ONLY rows (N long)


def ragged_tiles(
    qo_indptr: torch.Tensor,
    query_lens: torch.Tensor,
    group: int,
    block_m: int,
    num_tokens: int,
    query_lens_cpu: torch.Tensor | None = None,
) -> QueryTiles:
    """Tile table of a ragged batch, built on the device (no host sync).

    The grid size is exact when the host has the lengths (``query_lens_cpu``), else the bound
    ``cdiv(num_tokens·group, block_m) + bs``; tiles past the last real one are marked −1 and
    return at once.
    """
    # qo_indptr: (bs + 1,) int64; query_lens: (bs,) int64
    bs = query_lens.shape[0]
    tiles = (query_lens * group + block_m - 1) // block_m  # (bs,)
    tile_end = torch.cumsum(tiles, dim=0)
    if query_lens_cpu is not None:  # a host tensor: no device sync
        num_tiles = int(((query_lens_cpu * group + block_m - 1) // block_m).sum())
    else:
        num_tiles = (num_tokens * group + block_m - 1) // block_m + bs
    index = torch.arange(num_tiles, dtype=torch.int64, device=query_lens.device)
    req = torch.searchsorted(tile_end, index, right=True)  # (num_tiles,) in [0, bs]
    first_tile = (tile_end - tiles)[req.clamp(max=bs - 1)]
    tile_req = torch.where(req < bs, req, -1)
    return QueryTiles(num_tiles, 0, qo_indptr, tile_req, index - first_tile)


def pool_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor | None,
    out: torch.Tensor,
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    new_slots: torch.Tensor,
    tiles: QueryTiles,
    tail: TailKeys,
    shared_dim: int,
    sm_scale: float,
    logit_cap: float,
    num_splits: int,
    config: LaunchConfig,
) -> None:
    """Attention of every query over its prefix and visible tail keys, written into ``out``.

    ``shared_dim`` is the number of leading K columns scored in the first dot (all of head_dim for
    MHA, kv_lora_rank for MLA; the rest, MLA's rope part, is a second dot). With
    ``v_buffer is None`` the values are those first ``shared_dim`` K columns (MLA's latent).
    """
    # q: (num_tokens, H, Dk); k_buffer: (rows, Hk, Dk); v_buffer: (rows, Hk, Dv) or None;
    # out: (num_tokens, H, Dv), written in place
    num_tokens, num_heads, head_dim = q.shape
    kv_heads = k_buffer.shape[1]
    value_dim = out.shape[2]
    assert q.stride(2) == 1 and k_buffer.stride(2) == 1 and out.stride(2) == 1
    assert num_heads % kv_heads == 0 and 0 < shared_dim <= head_dim
    v_from_k = v_buffer is None
    if v_from_k:
        assert value_dim == shared_dim, "values taken from K must be its first shared_dim columns"
        v_buffer = k_buffer
    else:
        assert v_buffer is not None and v_buffer.stride(2) == 1
    if num_tokens == 0 or tiles.num_tiles == 0:
        return
    dummy = seq_lens

    def pointer(t: torch.Tensor | None) -> torch.Tensor:
        return t if t is not None and t.numel() > 0 else dummy

    split = num_splits > 1
    if split:
        part_o = torch.empty(
            num_tokens, num_heads, num_splits, value_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            num_tokens, num_heads, num_splits, dtype=torch.float32, device=q.device
        )
    else:
        part_o = part_lse = out
    mask = tail.tree_mask.view(torch.uint8) if tail.tree_mask is not None else dummy
    grid = (tiles.num_tiles, kv_heads, num_splits)
    _pool_attention_kernel[grid](
        q,
        k_buffer,
        v_buffer,
        out,
        part_o,
        part_lse,
        req_to_token,
        req_pool_indices,
        seq_lens,
        new_slots,
        pointer(tail.ancestor_slots),
        pointer(tiles.qo_indptr),
        pointer(tiles.tile_req),
        pointer(tiles.tile_idx),
        pointer(mask),
        pointer(tail.mask_indptr),
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        out.stride(0),
        out.stride(1),
        req_to_token.stride(0),
        num_heads,
        sm_scale,
        logit_cap,
        num_splits,
        config.min_chunk,
        tiles.tiles_per_req,
        tail.width,
        tail.depth,
        DA=shared_dim,
        DB=head_dim - shared_dim,
        DV=value_dim,
        GROUP=num_heads // kv_heads,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_DA=block_dim(shared_dim),
        BLOCK_DB=block_dim(head_dim - shared_dim),
        BLOCK_DV=block_dim(value_dim),
        TAIL=tail.kind,
        MASK_FULL=tail.mask_full,
        RAGGED=tiles.tile_req is not None,
        V_FROM_K=v_from_k,
        DOT_FP32=config.dot_fp32,
        PRECISION="ieee" if config.dot_fp32 else None,
        HAS_CAP=logit_cap > 0,
        SPLIT=split,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if split:
        block_r = 16
        num_rows = num_tokens * num_heads
        _merge_splits_kernel[(triton.cdiv(num_rows, block_r),)](
            part_o,
            part_lse,
            out,
            num_rows,
            num_heads,
            num_splits,
            out.stride(0),
            out.stride(1),
            DV=value_dim,
            BLOCK_R=block_r,
            BLOCK_DV=block_dim(value_dim),
        )


class BaselineTritonAttentionBackend:
    """The Triton backend as of commit 0832b6f (unchanged but for its name).

    One kernel launch per layer (two when the key range is split), no host sync, any mode.

    A program reads each K/V block of its request once for a whole tile of (query, GQA head) rows,
    so verify and draft modes read the prefix ``ceil(rows / BLOCK_M)`` times per kv head, not once
    per query. When ``bs · tiles · kv_heads`` programs cannot fill the device, each request's key
    range is split into up to ``max_kv_splits`` chunks merged by log-sum-exp (flash-decoding).

    Options: ``target_programs`` — programs to aim for when choosing the split count (default:
    4 per SM on CUDA, 1 on CPU, i.e. no split under the interpreter unless asked);
    ``block_n``/``num_warps``/``num_stages`` — kernel tiling (defaults per device and head size).
    """

    def __init__(
        self,
        kv_pool: KVCache,
        req_to_token_pool: ReqToTokenPool,
        *,
        max_batch_size: int = 64,
        max_kv_splits: int = 32,
        target_programs: int | None = None,
        block_n: int | None = None,
        num_warps: int = 4,
        num_stages: int = 2,
    ) -> None:
        if max_kv_splits < 1:
            raise ValueError(f"max_kv_splits must be >= 1, got {max_kv_splits}")
        self._pool = kv_pool
        self._req_to_token_pool = req_to_token_pool
        self._device = kv_pool.geometry.device
        self._on_cpu = self._device.type == "cpu"
        self._buffers = PlanBuffers(max_batch_size, self._device)
        self._max_kv_splits = max_kv_splits
        if target_programs is None:
            target_programs = 1
            if self._device.type == "cuda":
                sms = torch.cuda.get_device_properties(self._device).multi_processor_count
                target_programs = 4 * sms
        self._target_programs = target_programs
        self._block_n = block_n
        self._num_warps = num_warps
        self._num_stages = num_stages
        self._plan: AttentionPlan | None = None
        self._tiles: dict[int, QueryTiles] = {}  # ragged tile tables of this forward, by block_m

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._plan = plan_forward(batch, self._buffers)
        self._tiles = {}

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv: bool = True,
    ) -> torch.Tensor:
        # q: (num_tokens, H, Dk); k: (num_tokens, Hk, Dk); v: (num_tokens, Hk, Dv) or None (MLA)
        plan = current_plan(self._plan, batch)
        check_layer(self._pool, layer)
        if save_kv:
            save_new_kv(self._pool, layer, batch, k, v)
        num_tokens, num_heads, value_dim = q.shape[0], layer.num_q_heads, layer.v_head_dim
        out = torch.empty(num_tokens, num_heads, value_dim, dtype=q.dtype, device=q.device)
        if plan.is_empty:
            return out.view(num_tokens, num_heads * value_dim)

        k_buf, v_buf = layer_kv_buffers(self._pool, layer.layer_id)
        if is_mla_pool(self._pool):
            shared_dim = self._mla_rank()
            values: torch.Tensor | None = None  # the latent columns of K
        else:
            shared_dim, values = layer.head_dim, v_buf
        group = layer.gqa_group
        config = self._config(q.dtype, layer.head_dim, plan.max_queries * group)
        tiles = self._query_tiles(plan, group, config.block_m)
        num_splits = self._num_splits(tiles.num_tiles * layer.num_kv_heads)
        pool_attention(
            q,
            k_buf,
            values,
            out,
            req_to_token=self._req_to_token_pool.req_to_token,
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            new_slots=batch.out_cache_loc,
            tiles=tiles,
            tail=self._tail_keys(plan),
            shared_dim=shared_dim,
            sm_scale=layer.scaling,
            logit_cap=layer.logit_cap,
            num_splits=num_splits,
            config=config,
        )
        return out.view(num_tokens, num_heads * value_dim)

    def _mla_rank(self) -> int:
        mla: MLAKVCache = self._pool  # type: ignore[assignment]
        return mla.kv_lora_rank

    def _config(self, dtype: torch.dtype, head_dim: int, rows_per_req: int) -> LaunchConfig:
        wide = head_dim > 256  # MLA's 576-wide rows need smaller tiles to stay in registers
        if self._on_cpu:  # the interpreter pays per op, not per element: few, large blocks
            block_m = min(64, block_dim(rows_per_req))
            block_n = self._block_n or 32
            return LaunchConfig(block_m, block_n, 1, 1, True, block_n)
        block_m = min(16 if wide else 64, block_dim(rows_per_req))
        block_n = self._block_n or (32 if wide else 64)
        return LaunchConfig(
            block_m,
            block_n,
            self._num_warps,
            self._num_stages,
            dtype == torch.float32,
            max(block_n, 256),
        )

    def _query_tiles(self, plan: AttentionPlan, group: int, block_m: int) -> QueryTiles:
        if plan.width:
            tiles_per_req = -(-plan.width * group // block_m)
            return QueryTiles(plan.batch_size * tiles_per_req, tiles_per_req)
        tiles = self._tiles.get(block_m * 4096 + group)
        if tiles is None:
            tiles = ragged_tiles(
                plan.qo_indptr,
                plan.query_lens,
                group,
                block_m,
                plan.num_tokens,
                plan.batch.extend_lens_cpu,
            )
            self._tiles[block_m * 4096 + group] = tiles
        return tiles

    def _num_splits(self, base_programs: int) -> int:
        wanted = -(-self._target_programs // max(base_programs, 1))
        return max(1, min(self._max_kv_splits, wanted))

    @staticmethod
    def _tail_keys(plan: AttentionPlan) -> TailKeys:
        if plan.tail is TailKind.TREE:
            assert plan.tree is not None
            return TailKeys(
                int(TailKind.TREE),
                plan.width,
                tree_mask=plan.tree.tree_mask,
                mask_indptr=plan.tree.mask_indptr,
                mask_full=plan.tree.mask_mode is TreeMaskMode.FULL_MASK,
            )
        if plan.tail is TailKind.BRANCH:
            return TailKeys(
                int(TailKind.BRANCH), plan.width, plan.depth, ancestor_slots=plan.ancestor_slots
            )
        return TailKeys(int(TailKind.CAUSAL), plan.width)
