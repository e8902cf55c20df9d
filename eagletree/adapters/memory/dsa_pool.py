"""Adapter: DSA KV pool — the MLA latent cache plus the lightning indexer's fp8 key cache."""

from __future__ import annotations

from typing import Final

import torch

from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.pool_rows import as_raw_words, check_slots_in_range, checked_move
from eagletree.ports.memory import RowMover

INDEX_KEY_DTYPE = torch.float8_e4m3fn


class DSAKVPool:
    """MLA buffers plus, per layer, indexer keys (num_rows, index_head_dim) fp8 and one fp32
    scale per token (num_rows,).

    The indexer cache is token-indexed, like the latent cache, so a move by token slot is right
    at any page size (upstream's page-indexed layout was corrupted by token-slot moves at page
    size > 1). ``move_kv_cache`` moves latent rows, keys and scales in lockstep, in one mover call.
    """

    def __init__(
        self,
        size: int,
        layer_num: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        mover: RowMover,
        index_head_dim: int = 128,
        page_size: int = 1,
        debug_checks: bool = False,
    ) -> None:
        self._latent = MLAKVPool(
            size, layer_num, kv_lora_rank, qk_rope_head_dim, dtype, device, mover,
            page_size=page_size, debug_checks=debug_checks,
        )  # fmt: skip
        self.geometry: Final = self._latent.geometry
        self.kv_lora_rank: Final = kv_lora_rank
        self.qk_rope_head_dim: Final = qk_rope_head_dim
        self.index_head_dim: Final = index_head_dim
        self.checks_enabled: Final = self._latent.checks_enabled
        self._mover = mover
        rows, dev = self.geometry.num_rows, self.geometry.device
        # index_k[l]: (rows, index_head_dim) fp8; index_scale[l]: (rows,) fp32, token-indexed
        self._index_k = [
            torch.zeros(rows, index_head_dim, dtype=INDEX_KEY_DTYPE, device=dev)
            for _ in range(layer_num)
        ]
        self._index_scale = [
            torch.zeros(rows, dtype=torch.float32, device=dev) for _ in range(layer_num)
        ]
        latent = self._latent.buffers()
        self._all_buffers = tuple(
            b for layer in zip(latent, self._index_k, self._index_scale, strict=True) for b in layer
        )

    def buffers(self) -> list[torch.Tensor]:
        """Every slot-indexed tensor, layer by layer: [latent0, index_k0, index_scale0, …]."""
        return list(self._all_buffers)

    def get_kv_buffer(self, layer: int) -> torch.Tensor:
        return self._latent.get_kv_buffer(layer)

    def set_kv_buffer(self, layer: int, loc: torch.Tensor, kv: torch.Tensor) -> None:
        self._latent.set_kv_buffer(layer, loc, kv)

    def set_mla_kv_buffer(
        self, layer: int, loc: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor
    ) -> None:
        self._latent.set_mla_kv_buffer(layer, loc, kv_latent, k_rope)

    def get_index_k_buffer(self, layer: int) -> torch.Tensor:
        """(num_rows, index_head_dim) float8_e4m3fn; dequantise with the scale buffer."""
        return self._index_k[layer]

    def get_index_scale_buffer(self, layer: int) -> torch.Tensor:
        """(num_rows,) float32, one scale per token slot."""
        return self._index_scale[layer]

    def set_index_k(
        self, layer: int, loc: torch.Tensor, k_fp8: torch.Tensor, scale: torch.Tensor
    ) -> None:
        """Store quantised indexer keys and their per-token scales."""
        # loc: (n,); k_fp8: (n, index_head_dim) float8_e4m3fn; scale: (n,) or (n, 1) float32
        if k_fp8.dtype != INDEX_KEY_DTYPE:
            raise TypeError(
                f"indexer keys must be quantised to {INDEX_KEY_DTYPE}, got {k_fp8.dtype}"
            )
        if self.checks_enabled:
            check_slots_in_range(loc, self.geometry.num_rows, "set_index_k")
        index = loc.long()
        as_raw_words(self._index_k[layer])[index] = as_raw_words(k_fp8)
        self._index_scale[layer][index] = scale.reshape(-1).to(torch.float32)

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        """Latent rows, indexer keys and scales: ``buf[tgt] = buf[src]``, one mover call."""
        checked_move(
            self._mover, self._all_buffers, self.geometry, self.checks_enabled,
            tgt_loc, src_loc, independent_groups,
        )  # fmt: skip
