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
from eagletree.adapters.kernels.triton.attention_launch import (
    LaunchConfig,
    QueryTiles,
    TailKeys,
    block_dim,
    ragged_tiles,
)
from eagletree.adapters.kernels.triton.pool_attention import pool_attention
from eagletree.adapters.kernels.triton.tree_bits import pack_tree_bits
from eagletree.domain.tree import TreeMaskMode
from eagletree.ports.memory import MLAKVCache, ReqToTokenPool

if TYPE_CHECKING:
    from eagletree.domain.attention_layer import AttentionLayer
    from eagletree.domain.batch import ForwardBatch


class TritonAttentionBackend:
    """One kernel launch per layer (two when the key range is split), no host sync, any mode.

    A program reads each K/V block of its request once for a whole tile of (query, GQA head) rows,
    so verify and draft modes read the prefix ``ceil(rows / BLOCK_M)`` times per kv head, not once
    per query. It walks the prefix in unmasked blocks and applies the mode's visibility (causal,
    tree, branch) only to the few tail blocks; a verify's tree mask is packed once per forward
    (one launch, shared by every layer) into one int32 word per 32 nodes. When
    ``bs · tiles · kv_heads`` programs cannot fill the device, each request's key range is split
    into up to ``max_kv_splits`` chunks merged by log-sum-exp (flash-decoding).

    Options: ``target_programs`` — programs to aim for when choosing the split count (default:
    4 per SM on CUDA, 1 on CPU, i.e. no split under the interpreter unless asked);
    ``block_m`` (most rows per tile), ``block_n``, ``num_warps``, ``num_stages`` and
    ``max_registers`` (a per-thread register cap, 0 for none) override the tiling that
    ``_config`` picks per device, head size and rows per request; ``min_chunk`` — the fewest
    keys one split handles (rounded up to whole key blocks; default one block), which decides
    how many splits a short prefix gets. One block is the fastest on the H200 for decode and
    verify at bs 1–32 over 256- and 1k-key prefixes (benchmarks/attention.py
    --min-chunk-sweep: a bs-1 decode of 256 keys 10.4 µs against 17.2 µs with 256 keys per
    split, which left most of its splits idle).
    """

    def __init__(
        self,
        kv_pool: KVCache,
        req_to_token_pool: ReqToTokenPool,
        *,
        max_batch_size: int = 64,
        max_kv_splits: int = 32,
        target_programs: int | None = None,
        block_m: int | None = None,
        block_n: int | None = None,
        num_warps: int | None = None,
        num_stages: int | None = None,
        max_registers: int | None = None,
        min_chunk: int | None = None,
    ) -> None:
        if min_chunk is not None and min_chunk < 1:
            raise ValueError(f"min_chunk must be >= 1, got {min_chunk}")
        if max_kv_splits < 1:
            raise ValueError(f"max_kv_splits must be >= 1, got {max_kv_splits}")
        for name, size in (("block_m", block_m), ("block_n", block_n)):
            if size is not None and (size < 16 or size & (size - 1)):
                raise ValueError(f"{name} must be a power of two >= 16, got {size}")
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
        self._block_m = block_m
        self._block_n = block_n
        self._num_warps = num_warps
        self._num_stages = num_stages
        self._max_registers = max_registers
        self._min_chunk = min_chunk
        self._plan: AttentionPlan | None = None
        self._tiles: dict[int, QueryTiles] = {}  # ragged tile tables of this forward, by block_m
        self._tail = TailKeys(int(TailKind.CAUSAL))
        # verify's packed tree mask: written in place every forward, so a captured graph that
        # holds it reads the current tree (grown, never shrunk, outside capture)
        self._tree_bits = torch.zeros(0, dtype=torch.int32, device=self._device)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        plan = plan_forward(batch, self._buffers)
        self._plan = plan
        self._tiles = {}
        self._tail = self._tail_keys(plan)

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
            tail=self._tail,
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
        rows = block_dim(rows_per_req)
        if self._on_cpu:  # the interpreter pays per op, not per element: few, large blocks
            block_m = min(self._block_m or 64, rows)
            block_n = self._block_n or 32
            return LaunchConfig(block_m, block_n, 1, 1, True, self._whole_blocks(block_n))
        # Defaults reasoned from the sm_90 build of each variant (registers, shared memory,
        # spills); benchmarks/attention.py --tune measures the alternatives on the H200. Three
        # stages double-buffer K/V (the slots are loaded a block ahead); 32-key blocks keep a
        # 32-row tile at 128 registers, so that 4 programs share an SM and keep enough loads
        # in flight.
        if head_dim > 256:  # MLA's 576-wide rows need small tiles to stay in registers
            block_m, block_n, warps, stages, registers = min(16, rows), 32, 4, 2, 0
        else:
            block_m = min(self._block_m or 256, rows)
            if block_m <= 32:  # decode, verify and draft tiles: memory-bound
                block_n, warps, stages, registers = 32, 4, 3, 128
            elif block_m == 64:  # one warpgroup's wgmma
                block_n, warps, stages, registers = 32, 4, 3, 0
            else:  # one warpgroup per 64 rows sharing each K/V block (verify N = 64: 256 rows)
                block_n, warps, stages, registers = 32, block_m // 16, 3, 128
        block_n = self._block_n or block_n
        if self._max_registers is not None:
            registers = self._max_registers
        return LaunchConfig(
            block_m,
            block_n,
            self._num_warps or warps,
            self._num_stages or stages,
            dtype == torch.float32,
            self._whole_blocks(block_n),
            registers or None,
        )

    def _whole_blocks(self, block_n: int) -> int:
        """``min_chunk`` keys (default one block) rounded up to whole blocks of ``block_n``."""
        keys = block_n if self._min_chunk is None else self._min_chunk
        return -(-keys // block_n) * block_n

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
        # the nearest whole number of splits: rounding up would leave a last, mostly idle wave
        wanted = (2 * self._target_programs + base_programs) // (2 * max(base_programs, 1))
        return max(1, min(self._max_kv_splits, wanted))

    def _tail_keys(self, plan: AttentionPlan) -> TailKeys:
        if plan.is_empty:
            return TailKeys(int(TailKind.CAUSAL))
        if plan.tail is TailKind.TREE:
            assert plan.tree is not None
            # once per forward, shared by every layer: the kernel reads a node's visibility of
            # its tree as one int32 word per 32 nodes instead of gathering mask bytes
            rows, words = plan.num_tokens, (plan.width + 31) // 32
            if self._tree_bits.numel() < rows * words:
                size = max(rows * words, 2 * self._tree_bits.numel())
                self._tree_bits = torch.zeros(size, dtype=torch.int32, device=self._device)
            bits = self._tree_bits[: rows * words].view(rows, words)
            tree = plan.tree
            full = tree.mask_mode is TreeMaskMode.FULL_MASK
            pack_tree_bits(
                tree.tree_mask, tree.mask_indptr, plan.batch.seq_lens, plan.width, full, bits
            )
            return TailKeys(int(TailKind.TREE), plan.width, tree_bits=bits)
        if plan.tail is TailKind.BRANCH:
            return TailKeys(
                int(TailKind.BRANCH), plan.width, plan.depth, ancestor_slots=plan.ancestor_slots
            )
        return TailKeys(int(TailKind.CAUSAL), plan.width)
