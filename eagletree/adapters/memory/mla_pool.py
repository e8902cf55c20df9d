"""Adapter: MLA KV pool — per layer one buffer holding the latent KV and the rope key of a token."""

from __future__ import annotations

from typing import Final

import torch

from eagletree.adapters.memory.pool_rows import (
    as_raw_words,
    check_slots_in_range,
    checked_move,
    checks_by_default,
)
from eagletree.domain.kv_geometry import KVGeometry
from eagletree.ports.memory import RowMover


class MLAKVPool:
    """Per layer (num_rows, 1, kv_lora_rank + qk_rope_head_dim), latent first, rope last.

    Row 0 is the dummy slot. ``move_kv_cache`` moves every layer's buffer in one ``mover`` call
    (upstream once shipped MLA pools without any move; this one has no other state to forget).
    Slot ranges are checked when ``checks_enabled`` (always on CPU, with ``debug_checks``
    elsewhere).
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
        page_size: int = 1,
        debug_checks: bool = False,
    ) -> None:
        self.geometry: Final = KVGeometry(size, page_size, layer_num, dtype, torch.device(device))
        self.kv_lora_rank: Final = kv_lora_rank
        self.qk_rope_head_dim: Final = qk_rope_head_dim
        self.checks_enabled: Final = checks_by_default(self.geometry.device, debug_checks)
        self._mover = mover
        rows, width = self.geometry.num_rows, kv_lora_rank + qk_rope_head_dim
        # kv_buffers[l]: (num_rows, 1, kv_lora_rank + qk_rope_head_dim)
        self._kv_buffers = tuple(
            torch.zeros(rows, 1, width, dtype=dtype, device=self.geometry.device)
            for _ in range(layer_num)
        )

    def buffers(self) -> list[torch.Tensor]:
        """Every slot-indexed tensor: one latent + rope buffer per layer."""
        return list(self._kv_buffers)

    def get_kv_buffer(self, layer: int) -> torch.Tensor:
        return self._kv_buffers[layer]

    def set_kv_buffer(self, layer: int, loc: torch.Tensor, kv: torch.Tensor) -> None:
        """Write full rows (latent then rope) of ``loc.numel()`` tokens."""
        # loc: (n,) slots; kv: (n, 1, kv_lora_rank + qk_rope_head_dim) or (n, that width)
        if self.checks_enabled:
            check_slots_in_range(loc, self.geometry.num_rows, "set_kv_buffer")
        buf = self._kv_buffers[layer]
        rows = kv.to(self.geometry.dtype).reshape(kv.shape[0], 1, buf.shape[-1])
        as_raw_words(buf)[loc.long()] = as_raw_words(rows)

    def set_mla_kv_buffer(
        self, layer: int, loc: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor
    ) -> None:
        """Write the latent and the rope part separately (no concatenated temporary)."""
        # loc: (n,); kv_latent: (n, 1, kv_lora_rank); k_rope: (n, 1, qk_rope_head_dim)
        if self.checks_enabled:
            check_slots_in_range(loc, self.geometry.num_rows, "set_mla_kv_buffer")
        words = as_raw_words(self._kv_buffers[layer])
        index, dtype = loc.long(), self.geometry.dtype
        rank, n = self.kv_lora_rank, index.numel()
        words[index, :, :rank] = as_raw_words(kv_latent.to(dtype).reshape(n, 1, rank))
        words[index, :, rank:] = as_raw_words(k_rope.to(dtype).reshape(n, 1, self.qk_rope_head_dim))

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        """``buf[tgt] = buf[src]`` for every layer's buffer, all sources read before any write."""
        checked_move(
            self._mover, self._kv_buffers, self.geometry, self.checks_enabled,
            tgt_loc, src_loc, independent_groups,
        )  # fmt: skip
