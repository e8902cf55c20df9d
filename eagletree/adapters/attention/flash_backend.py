"""Adapter: the FlashAttention AttentionBackend — FlashAttention-2 on gathered KV, tree cascade."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.adapters.attention.dense_attention import masked_attention, merge_by_lse
from eagletree.adapters.attention.flash_varlen import (
    VarlenKernel,
    lse_per_token,
    select_varlen_kernel,
)
from eagletree.adapters.attention.metadata import (
    AttentionPlan,
    PlanBuffers,
    TailKind,
    plan_forward,
    tail_layout,
)
from eagletree.adapters.attention.pool_access import (
    KVCache,
    check_layer,
    current_plan,
    gather_rows,
    is_mla_pool,
    layer_kv_buffers,
    save_new_kv,
)
from eagletree.adapters.kernels.triton.kv_gather import gather_kv_rows
from eagletree.ports.memory import MHAKVCache, MLAKVCache, ReqToTokenPool

if TYPE_CHECKING:
    from eagletree.domain.attention_layer import AttentionLayer
    from eagletree.domain.batch import ForwardBatch

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256  # FlashAttention-2's limit; head dims must also be multiples of 8


@dataclass(frozen=True, slots=True)
class _KeyRanges:
    """Packed key ranges of one forward: request b's keys at ``[cu_k[b], cu_k[b + 1])``."""

    cu_q: torch.Tensor  # (bs + 1,) int32
    cu_k: torch.Tensor  # (bs + 1,) int32
    num_rows: int  # host bound of the packed key rows (exact when the host knows the lengths)
    max_k: int  # host bound of one request's keys
    with_tail: bool  # CAUSAL modes: prefix then new tokens; tree/branch modes: prefix only


class FlashAttentionBackend:
    """CUDA only, fp16/bf16 only; MHA/GQA and MLA up to FlashAttention-2's head_dim 256.

    The pool has one-token pages, which FlashAttention-2's paged path (pages of 256) cannot
    address, so each forward first gathers the keys into a packed tensor (one Triton launch for K
    and one for V), then:
      * EXTEND, DECODE, DRAFT_EXTEND: one causal varlen call over prefix + new tokens;
      * TARGET_VERIFY, DRAFT_DECODE: a cascade — a non-causal call over the prefix, a dense masked
        pass over the ≤ N tail keys (tree ancestors, or a branch's draft ancestors), merged by LSE.
    MLA in the absorbed form passes the latent + rope row as both K and V and keeps the first
    kv_lora_rank output columns, so rows wider than 256 (DeepSeek's 576) are refused at
    construction. Logit capping is not supported. With ``seq_lens_sum is None`` the gather
    buffer is sized ``bs · row_width`` (no host sync, fixed shapes).

    ``use_flash_attn``: True requires the flash_attn package, False forces PyTorch's bundled
    kernels, None prefers the package. ``varlen_kernel`` replaces the FlashAttention call by any
    function with its semantics (``flash_varlen.VarlenKernel``); it lifts the CUDA requirement.
    """

    def __init__(
        self,
        kv_pool: KVCache,
        req_to_token_pool: ReqToTokenPool,
        *,
        max_batch_size: int = 64,
        use_flash_attn: bool | None = None,
        varlen_kernel: VarlenKernel | None = None,
    ) -> None:
        device = kv_pool.geometry.device
        if device.type != "cuda" and varlen_kernel is None:
            raise RuntimeError(
                f"FlashAttentionBackend needs a CUDA device (the pool is on {device}): "
                "FlashAttention has no CPU kernels; use TorchAttentionBackend or "
                "TritonAttentionBackend there"
            )
        dtype = kv_pool.geometry.dtype
        if dtype not in _FLASH_DTYPES:
            raise ValueError(f"FlashAttention computes in fp16/bf16, the pool's dtype is {dtype}")
        if is_mla_pool(kv_pool):
            mla: MLAKVCache = kv_pool  # type: ignore[assignment]
            width = mla.kv_lora_rank + mla.qk_rope_head_dim
            what = f"an MLA row of {mla.kv_lora_rank} + {mla.qk_rope_head_dim}"
        else:
            mha: MHAKVCache = kv_pool  # type: ignore[assignment]
            width = mha.head_dim
            what = f"head_dim {mha.head_dim}"
            if mha.v_head_dim != mha.head_dim:
                raise ValueError("FlashAttention-2 needs v_head_dim == head_dim")
        if width > _MAX_HEAD_DIM or width % 8:
            raise ValueError(
                f"FlashAttention-2 supports head dims up to {_MAX_HEAD_DIM} in multiples of 8, "
                f"not {what}; use TritonAttentionBackend"
            )
        self._pool = kv_pool
        self._req_to_token_pool = req_to_token_pool
        if varlen_kernel is None:
            self.kernel_source, self._varlen = select_varlen_kernel(use_flash_attn)
        else:  # a stand-in with FlashAttention-2's semantics (tests run the logic on CPU)
            self.kernel_source, self._varlen = "injected", varlen_kernel
        self._buffers = PlanBuffers(max_batch_size, device)
        self._cu_k64 = torch.zeros(max_batch_size + 1, dtype=torch.int64, device=device)
        self._cu_q = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device)
        self._cu_k = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device)
        self._plan: AttentionPlan | None = None
        self._ranges: _KeyRanges | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        plan = plan_forward(batch, self._buffers)
        self._plan = plan
        self._ranges = None if plan.is_empty else self._key_ranges(plan)

    def _key_ranges(self, plan: AttentionPlan) -> _KeyRanges:
        batch, bs = plan.batch, plan.batch_size
        if bs + 1 > self._cu_k.shape[0]:
            device = self._cu_k.device
            self._cu_k64 = torch.zeros(2 * bs + 1, dtype=torch.int64, device=device)
            self._cu_q = torch.zeros(2 * bs + 1, dtype=torch.int32, device=device)
            self._cu_k = torch.zeros(2 * bs + 1, dtype=torch.int32, device=device)
        with_tail = plan.tail is TailKind.CAUSAL
        lens = batch.seq_lens + plan.query_lens if with_tail else batch.seq_lens
        torch.cumsum(lens, dim=0, out=self._cu_k64[1 : bs + 1])
        cu_k = self._cu_k[: bs + 1]
        cu_k.copy_(self._cu_k64[: bs + 1])
        cu_q = self._cu_q[: bs + 1]
        cu_q.copy_(plan.qo_indptr)

        row_width = self._req_to_token_pool.req_to_token.shape[1]
        if batch.seq_lens_cpu is not None:
            max_prefix = int(batch.seq_lens_cpu.max())  # host tensor: no device sync
        else:
            max_prefix = row_width if batch.seq_lens_sum is None else batch.seq_lens_sum
        prefix_rows = batch.seq_lens_sum if batch.seq_lens_sum is not None else bs * row_width
        tail_rows, tail_max = (plan.num_tokens, plan.max_queries) if with_tail else (0, 0)
        return _KeyRanges(cu_q, cu_k, prefix_rows + tail_rows, max_prefix + tail_max, with_tail)

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
        if layer.logit_cap > 0:
            raise NotImplementedError("FlashAttentionBackend does not support logit capping")
        if q.dtype not in _FLASH_DTYPES:
            raise ValueError(f"FlashAttention needs fp16/bf16 queries, got {q.dtype}")
        if save_kv:
            save_new_kv(self._pool, layer, batch, k, v)
        num_tokens, num_heads, value_dim = q.shape[0], layer.num_q_heads, layer.v_head_dim
        if plan.is_empty or self._ranges is None:
            return q.new_zeros(num_tokens, num_heads * value_dim)
        ranges = self._ranges
        k_buf, v_buf = layer_kv_buffers(self._pool, layer.layer_id)
        mla = is_mla_pool(self._pool)
        keys = self._gather(k_buf, plan, ranges, q.dtype)
        values = keys if mla else self._gather(v_buf, plan, ranges, q.dtype)
        q = q.contiguous()
        # FlashAttention-2 reshapes q as one query per request when max_q == 1 (its GQA decode
        # path), which a ragged batch with empty requests breaks; a bound of 2 avoids that path
        max_q = plan.max_queries if plan.width else max(plan.max_queries, 2)
        if ranges.max_k > 0:
            o, lse = self._varlen(
                q,
                keys,
                values,
                ranges.cu_q,
                ranges.cu_k,
                max_q,
                ranges.max_k,
                layer.scaling,
                ranges.with_tail,
            )
            o = o[..., :value_dim]  # MLA: the latent columns of the (latent + rope) values
        else:  # every prefix is empty and there is no tail in this pass
            o = q.new_zeros(num_tokens, num_heads, value_dim)
            lse = torch.full((num_heads, num_tokens), float("inf"), device=q.device)
        if ranges.with_tail:
            return o.reshape(num_tokens, num_heads * value_dim)

        # cascade: the prefix pass above, a dense masked pass over the tail keys, LSE merge
        layout = tail_layout(plan)
        bs, width = plan.batch_size, plan.width
        tail_keys = gather_rows(k_buf, layout.tail_slots).to(q.dtype)  # (bs, T, Hk, Dk)
        tail_values = gather_rows(v_buf, layout.tail_slots).to(q.dtype)  # (bs, T, Hk, Dv)
        o_tail, lse_tail = masked_attention(
            q.view(bs, width, num_heads, -1),
            tail_keys,
            tail_values,
            layout.tail_visible,
            layer.scaling,
        )
        merged = merge_by_lse(
            o, lse_per_token(lse, bs, width), o_tail.flatten(0, 1), lse_tail.flatten(0, 1)
        )
        return merged.to(q.dtype).view(num_tokens, num_heads * value_dim)

    def _gather(
        self, buf: torch.Tensor, plan: AttentionPlan, ranges: _KeyRanges, dtype: torch.dtype
    ) -> torch.Tensor:
        batch = plan.batch
        packed = torch.empty(
            max(ranges.num_rows, 1), *buf.shape[1:], dtype=dtype, device=buf.device
        )
        gather_kv_rows(
            buf,
            packed,
            req_to_token=self._req_to_token_pool.req_to_token,
            req_pool_indices=batch.req_pool_indices,
            prefix_lens=batch.seq_lens,
            dst_indptr=ranges.cu_k,
            max_rows_per_req=ranges.max_k,
            tail_slots=batch.out_cache_loc if ranges.with_tail else None,
            tail_indptr=plan.qo_indptr if ranges.with_tail else None,
        )
        return packed
