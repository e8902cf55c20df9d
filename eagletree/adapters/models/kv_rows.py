"""Adapter: whether a model's fused layers may write their new KV rows into an MHA pool's
buffers themselves — asked once, when a runner is built over the pool (``check_pool_fits``).

A layer that stores its own k/v (fused with RoPE) writes rows of these buffers at
``out_cache_loc``, as the pool's ``set_kv_buffer`` would, and calls its backend with
``save_kv=False``. Pools that translate slots or hold other layouts (hybrid sliding-window
pools), and pools that store fp8 (whose conversion stays torch's), give None: they take a model
built without fused kernels, whose backend stores. MLA pools always take such writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.adapters.attention.pool_access import is_mla_pool

if TYPE_CHECKING:
    from eagletree.ports.memory import KVPool, MHAKVCache


def mha_kv_buffers(pool: KVPool | None, layer_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(K (slots, kv_heads, head_dim), V (slots, kv_heads, v_head_dim)) of an MHA pool."""
    if pool is None or is_mla_pool(pool) or not hasattr(pool, "get_key_buffer"):
        return None
    mha: MHAKVCache = pool  # type: ignore[assignment]
    keys = mha.get_key_buffer(layer_id)
    if keys.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return None
    return keys, mha.get_value_buffer(layer_id)
