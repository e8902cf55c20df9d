"""Adapter: the Triton AttentionBackend — split-KV tiles over the pool for every forward mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

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
from eagletree.adapters.kernels.triton.pool_attention import (
    LaunchConfig,
    QueryTiles,
    TailKeys,
    block_dim,
    pool_attention,
    ragged_tiles,
)
from eagletree.domain.tree import TreeMaskMode
from eagletree.ports.memory import MLAKVCache, ReqToTokenPool

if TYPE_CHECKING:
    from eagletree.domain.attention_layer import AttentionLayer
    from eagletree.domain.batch import ForwardBatch


class TritonAttentionBackend:
    """One kernel launch per layer (two when the key range is split), no host sync, any mode.

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
        self._device = kv_pool.device
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
