"""Adapter helper: how attention backends read and write a KV pool of either family (MHA or MLA)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.adapters.attention.metadata import AttentionPlan
from eagletree.adapters.memory.pool_rows import as_raw_words
from eagletree.ports.memory import MHAKVCache, MLAKVCache

if TYPE_CHECKING:
    from eagletree.domain.attention_layer import AttentionLayer
    from eagletree.domain.batch import ForwardBatch

KVCache = MHAKVCache | MLAKVCache


def is_mla_pool(pool: object) -> bool:
    """MLA pools hold one latent + rope buffer per layer; only they have a ``kv_lora_rank``."""
    return hasattr(pool, "kv_lora_rank")


def check_layer(pool: KVCache, layer: AttentionLayer) -> None:
    """The layer's family and widths must match the pool's (host metadata only)."""
    if is_mla_pool(pool):
        mla: MLAKVCache = pool  # type: ignore[assignment]
        width = mla.kv_lora_rank + mla.qk_rope_head_dim
        if not layer.is_mla or layer.num_kv_heads != 1 or layer.head_dim != width:
            raise ValueError(
                f"an MLA pool (latent {mla.kv_lora_rank} + rope {mla.qk_rope_head_dim}) needs an "
                f"MLA layer with 1 kv head and head_dim {width}, got {layer}"
            )
        if layer.v_head_dim != mla.kv_lora_rank:
            raise ValueError(f"MLA v_head_dim must be kv_lora_rank={mla.kv_lora_rank}: {layer}")
        return
    mha: MHAKVCache = pool  # type: ignore[assignment]
    if layer.is_mla or (layer.num_kv_heads, layer.head_dim, layer.v_head_dim) != (
        mha.kv_heads,
        mha.head_dim,
        mha.v_head_dim,
    ):
        raise ValueError(
            f"an MHA pool ({mha.kv_heads} kv heads × {mha.head_dim}/{mha.v_head_dim}) cannot serve "
            f"{layer}"
        )
    if layer.num_q_heads % layer.num_kv_heads:
        raise ValueError(f"q heads must be a multiple of kv heads: {layer}")


def layer_kv_buffers(pool: KVCache, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) of one layer: K (rows, kv_heads, head_dim), V (rows, kv_heads, v_head_dim).

    For MLA both are views of the one buffer: K is the latent + rope row, V its latent columns.
    """
    if is_mla_pool(pool):
        mla: MLAKVCache = pool  # type: ignore[assignment]
        kv = mla.get_kv_buffer(layer_id)
        return kv, kv[..., : mla.kv_lora_rank]
    mha: MHAKVCache = pool  # type: ignore[assignment]
    return mha.get_key_buffer(layer_id), mha.get_value_buffer(layer_id)


def save_new_kv(
    pool: KVCache,
    layer: AttentionLayer,
    batch: ForwardBatch,
    k: torch.Tensor,
    v: torch.Tensor | None,
) -> None:
    """Write the new tokens' k (and v) at ``batch.out_cache_loc`` (the pool converts dtypes)."""
    if batch.num_tokens == 0:
        return
    if is_mla_pool(pool):
        mla: MLAKVCache = pool  # type: ignore[assignment]
        mla.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k)
        return
    if v is None:
        raise ValueError("an MHA layer needs v to save the new tokens' values")
    mha: MHAKVCache = pool  # type: ignore[assignment]
    mha.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k, v)


def gather_rows(buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``buf[slots]`` for any storage dtype (fp8 is gathered through an integer view)."""
    # buf: (rows, *row_shape); slots: any shape of int64 -> (*slots.shape, *row_shape)
    if buf.element_size() == 1 and buf.dtype.is_floating_point:
        return as_raw_words(buf)[slots].view(buf.dtype)
    return buf[slots]


def current_plan(plan: AttentionPlan | None, batch: ForwardBatch) -> AttentionPlan:
    """The plan of ``batch``; forward without init_forward_metadata for that batch is an error."""
    if plan is None or plan.batch is not batch:
        raise RuntimeError("call init_forward_metadata(batch) before forward with that batch")
    return plan
