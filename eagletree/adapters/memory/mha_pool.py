"""Adapter: MHA / GQA KV pool — per layer a K and a V buffer indexed by token slot."""

from __future__ import annotations

import torch

from eagletree.adapters.memory.bounds import check_move, check_slots_in_range, checks_by_default
from eagletree.adapters.memory.raw_words import as_raw_words
from eagletree.ports.memory import RowMover


class MHAKVPool:
    """K (size + page_size, kv_heads, head_dim) and V (…, v_head_dim) per layer, in ``store_dtype``.

    With an fp8 ``store_dtype`` (e.g. ``torch.float8_e4m3fn``) ``set_kv_buffer`` converts on write
    and readers convert gathered rows to ``dtype``. Row 0 of every buffer is the dummy slot.
    ``move_kv_cache`` moves every K and V buffer in one ``mover`` call.
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
        if size < 1 or layer_num < 0 or page_size < 1:
            raise ValueError(f"bad pool shape: size={size}, layers={layer_num}, page={page_size}")
        self._size = size
        self._page_size = page_size
        self._layer_num = layer_num
        self._kv_heads = kv_heads
        self._head_dim = head_dim
        self._v_head_dim = v_head_dim
        self._dtype = dtype
        self._store_dtype = dtype if store_dtype is None else store_dtype
        self._device = torch.device(device)
        self._mover = mover
        self._checks = checks_by_default(self._device, debug_checks)
        num_rows = size + page_size
        # k_buffers[l]: (num_rows, kv_heads, head_dim)
        # v_buffers[l]: (num_rows, kv_heads, v_head_dim)
        self._k_buffers = [
            torch.zeros(num_rows, kv_heads, head_dim, dtype=self._store_dtype, device=self._device)
            for _ in range(layer_num)
        ]
        self._v_buffers = [
            torch.zeros(
                num_rows, kv_heads, v_head_dim, dtype=self._store_dtype, device=self._device
            )
            for _ in range(layer_num)
        ]
        # One immutable sequence: movers cache their device pointer table per sequence object.
        self._all_buffers = tuple(
            b for kv in zip(self._k_buffers, self._v_buffers, strict=True) for b in kv
        )

    @property
    def size(self) -> int:
        return self._size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def layer_num(self) -> int:
        return self._layer_num

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def store_dtype(self) -> torch.dtype:
        return self._store_dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def kv_heads(self) -> int:
        return self._kv_heads

    @property
    def head_dim(self) -> int:
        return self._head_dim

    @property
    def v_head_dim(self) -> int:
        return self._v_head_dim

    @property
    def num_rows(self) -> int:
        """Rows per buffer: ``size + page_size`` (valid slots are ``[0, num_rows)``)."""
        return self._size + self._page_size

    @property
    def checks_enabled(self) -> bool:
        """Whether slot ranges are checked (always on CPU, with ``debug_checks`` elsewhere)."""
        return self._checks

    def buffers(self) -> list[torch.Tensor]:
        """Every slot-indexed tensor, layer by layer: [K0, V0, K1, V1, …]."""
        return list(self._all_buffers)

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self._k_buffers[layer]

    def get_value_buffer(self, layer: int) -> torch.Tensor:
        return self._v_buffers[layer]

    def get_kv_buffer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._k_buffers[layer], self._v_buffers[layer]

    def set_kv_buffer(
        self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write k, v of ``loc.numel()`` tokens, converting to the storage dtype."""
        # loc: (n,) slots; k: (n, kv_heads, head_dim); v: (n, kv_heads, v_head_dim)
        if self._checks:
            check_slots_in_range(loc, self.num_rows, "set_kv_buffer")
        index = loc.long()
        # Written through integer views: index_put has no fp8 kernels on every device.
        as_raw_words(self._k_buffers[layer])[index] = as_raw_words(k.to(self._store_dtype))
        as_raw_words(self._v_buffers[layer])[index] = as_raw_words(v.to(self._store_dtype))

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        """``buf[tgt] = buf[src]`` for every K and V buffer, all sources read before any write."""
        # tgt_loc, src_loc: (num_moves,) slots; distinct targets except (0, 0) padding
        if self._layer_num == 0:
            return
        check_move(tgt_loc, src_loc, self._device, self.num_rows, self._checks)
        self._mover.move(self._all_buffers, tgt_loc, src_loc, independent_groups=independent_groups)
