"""Adapter: the reference AttentionBackend — dense fp32 attention with explicit boolean masks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.adapters.attention.dense_attention import masked_attention
from eagletree.adapters.attention.metadata import (
    AttentionPlan,
    PlanBuffers,
    plan_forward,
    tail_layout,
)
from eagletree.adapters.attention.pool_access import (
    KVCache,
    check_layer,
    current_plan,
    gather_rows,
    layer_kv_buffers,
    save_new_kv,
)
from eagletree.ports.memory import ReqToTokenPool

if TYPE_CHECKING:
    from eagletree.domain.attention_layer import AttentionLayer
    from eagletree.domain.batch import ForwardBatch


class TorchAttentionBackend:
    """The specification the fast backends are tested against; CPU and GPU, any dtype.

    Every request's keys are its req_to_token row up to a host-known width (``max(seq_lens_cpu)``
    when the batch has host lengths, else the whole row, so a GPU-only batch never synchronises)
    followed by its tail keys (``metadata.tail_layout``); one boolean mask says what each query
    sees. Cost: O(bs · n · (row width + tail)) fp32 scores — a reference, not a fast path.
    """

    def __init__(
        self, kv_pool: KVCache, req_to_token_pool: ReqToTokenPool, max_batch_size: int = 64
    ) -> None:
        self._pool = kv_pool
        self._req_to_token_pool = req_to_token_pool
        self._buffers = PlanBuffers(max_batch_size, kv_pool.geometry.device)
        self._plan: AttentionPlan | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._plan = plan_forward(batch, self._buffers)

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
        num_tokens, num_heads = q.shape[0], layer.num_q_heads
        if plan.is_empty:
            return q.new_zeros(num_tokens, num_heads * layer.v_head_dim)
        o = self._attend(q, layer, plan)  # (num_tokens, H, Dv) fp32
        return o.to(q.dtype).view(num_tokens, num_heads * layer.v_head_dim)

    def _attend(self, q: torch.Tensor, layer: AttentionLayer, plan: AttentionPlan) -> torch.Tensor:
        batch, bs = plan.batch, plan.batch_size
        device = q.device
        layout = tail_layout(plan)
        n = layout.query_index.shape[1]

        # prefix keys: the first prefix_width positions of each request's row
        table = self._req_to_token_pool.req_to_token
        if batch.seq_lens_cpu is not None:
            prefix_width = int(batch.seq_lens_cpu.max())  # host tensor: no device sync
        else:
            prefix_width = table.shape[1]
        position = torch.arange(prefix_width, device=device)
        prefix_visible = position.view(1, -1) < batch.seq_lens.view(bs, 1)  # (bs, Wp)
        rows = table[batch.req_pool_indices.long(), :prefix_width].to(torch.int64)
        prefix_slots = torch.where(prefix_visible, rows, 0)  # never gather a stale slot id

        slots = torch.cat([prefix_slots, layout.tail_slots], dim=1)  # (bs, Wp + T)
        visible = torch.cat(
            [prefix_visible.unsqueeze(1).expand(bs, n, prefix_width), layout.tail_visible], dim=2
        )  # (bs, n, Wp + T)
        k_buf, v_buf = layer_kv_buffers(self._pool, layer.layer_id)
        keys = gather_rows(k_buf, slots)  # (bs, Wp + T, Hk, Dk)
        values = gather_rows(v_buf, slots)  # (bs, Wp + T, Hk, Dv)
        queries = q[layout.query_index]  # (bs, n, H, Dk)
        o, _ = masked_attention(
            queries, keys, values, visible, layer.scaling, layer.logit_cap
        )  # (bs, n, H, Dv)

        # scatter the query rows back to their tokens; padding rows land on a spare last row
        num_tokens = plan.num_tokens
        target = torch.where(layout.query_valid, layout.query_index, num_tokens).flatten()
        out = torch.zeros(num_tokens + 1, *o.shape[2:], dtype=torch.float32, device=device)
        out.index_copy_(0, target, o.flatten(0, 1))
        return out[:num_tokens]
