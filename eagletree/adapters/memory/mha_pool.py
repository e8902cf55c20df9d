"""Adapter: MHA / GQA KV pool — per layer a K and a V buffer indexed by token slot."""

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


class MHAKVPool:
    """K (num_rows, kv_heads, head_dim) and V (…, v_head_dim) per layer, in ``store_dtype``.

    With an fp8 ``store_dtype`` (e.g. ``torch.float8_e4m3fn``) ``set_kv_buffer`` converts on write
    and readers convert gathered rows to ``geometry.dtype``. Row 0 of every buffer is the dummy
    slot. ``move_kv_cache`` moves every K and V buffer in one ``mover`` call. Slot ranges are
    checked when ``checks_enabled`` (always on CPU, with ``debug_checks`` elsewhere).
    """

    def __init__(
        self,
        size: int,
        layer_num: int,
        kv_heads: int,
        head_dim: int,
        v_head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        mover: RowMover,
        store_dtype: torch.dtype | None = None,
        page_size: int = 1,
        debug_checks: bool = False,
    ) -> None:
        self.geometry: Final = KVGeometry(size, page_size, layer_num, dtype, torch.device(device))
        self.kv_heads: Final = kv_heads
        self.head_dim: Final = head_dim
        self.v_head_dim: Final = v_head_dim
        self.store_dtype: Final = dtype if store_dtype is None else store_dtype
        self.checks_enabled: Final = checks_by_default(self.geometry.device, debug_checks)
        self._mover = mover
        rows, dev = self.geometry.num_rows, self.geometry.device
        # k_buffers[l]: (num_rows, kv_heads, head_dim)
        # v_buffers[l]: (num_rows, kv_heads, v_head_dim)
        self._k_buffers = [
            torch.zeros(rows, kv_heads, head_dim, dtype=self.store_dtype, device=dev)
            for _ in range(layer_num)
        ]
        self._v_buffers = [
            torch.zeros(rows, kv_heads, v_head_dim, dtype=self.store_dtype, device=dev)
            for _ in range(layer_num)
        ]
        # One immutable sequence: movers cache their device pointer table per sequence object.
        self._all_buffers = tuple(
            b for kv in zip(self._k_buffers, self._v_buffers, strict=True) for b in kv
        )

    def buffers(self) -> list[torch.Tensor]:
        """Every slot-indexed tensor, layer by layer: [K0, V0, K1, V1, …]."""
        return list(self._all_buffers)

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self._k_buffers[layer]

    def get_value_buffer(self, layer: int) -> torch.Tensor:
        return self._v_buffers[layer]

    def set_kv_buffer(
        self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write k, v of ``loc.numel()`` tokens, converting to the storage dtype."""
        # loc: (n,) slots; k: (n, kv_heads, head_dim); v: (n, kv_heads, v_head_dim)
        if self.checks_enabled:
            check_slots_in_range(loc, self.geometry.num_rows, "set_kv_buffer")
        index = loc.long()
        # Written through integer views: index_put has no fp8 kernels on every device.
        as_raw_words(self._k_buffers[layer])[index] = as_raw_words(k.to(self.store_dtype))
        as_raw_words(self._v_buffers[layer])[index] = as_raw_words(v.to(self.store_dtype))

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        """``buf[tgt] = buf[src]`` for every K and V buffer, all sources read before any write."""
        checked_move(
            self._mover, self._all_buffers, self.geometry, self.checks_enabled,
            tgt_loc, src_loc, independent_groups,
        )  # fmt: skip
