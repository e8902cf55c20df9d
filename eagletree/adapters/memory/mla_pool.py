"""Adapter: MLA KV pool — per layer one buffer holding the latent KV and the rope key of a token."""

from __future__ import annotations

import torch

from eagletree.adapters.memory.bounds import check_move, check_slots_in_range, checks_by_default
from eagletree.adapters.memory.raw_words import as_raw_words
from eagletree.ports.memory import RowMover


class MLAKVPool:
    """Per layer (size + page_size, 1, kv_lora_rank + qk_rope_head_dim), latent first, rope last.

    Row 0 is the dummy slot. ``move_kv_cache`` moves every layer's buffer in one ``mover`` call
    (upstream once shipped MLA pools without any move; this one has no other state to forget).
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
        if size < 1 or layer_num < 0 or page_size < 1:
            raise ValueError(f"bad pool shape: size={size}, layers={layer_num}, page={page_size}")
        self._size = size
        self._page_size = page_size
        self._layer_num = layer_num
        self._kv_lora_rank = kv_lora_rank
        self._qk_rope_head_dim = qk_rope_head_dim
        self._dtype = dtype
        self._device = torch.device(device)
        self._mover = mover
        self._checks = checks_by_default(self._device, debug_checks)
        row_width = kv_lora_rank + qk_rope_head_dim
        # kv_buffers[l]: (num_rows, 1, kv_lora_rank + qk_rope_head_dim)
        self._kv_buffers = tuple(
            torch.zeros(self.num_rows, 1, row_width, dtype=dtype, device=self._device)
            for _ in range(layer_num)
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
    def device(self) -> torch.device:
        return self._device

    @property
    def kv_lora_rank(self) -> int:
        return self._kv_lora_rank

    @property
    def qk_rope_head_dim(self) -> int:
        return self._qk_rope_head_dim

    @property
    def num_rows(self) -> int:
        """Rows per buffer: ``size + page_size`` (valid slots are ``[0, num_rows)``)."""
        return self._size + self._page_size

    @property
    def checks_enabled(self) -> bool:
        """Whether slot ranges are checked (always on CPU, with ``debug_checks`` elsewhere)."""
        return self._checks

    def buffers(self) -> list[torch.Tensor]:
        """Every slot-indexed tensor: one latent + rope buffer per layer."""
        return list(self._kv_buffers)

    def get_kv_buffer(self, layer: int) -> torch.Tensor:
        return self._kv_buffers[layer]

    def set_kv_buffer(self, layer: int, loc: torch.Tensor, kv: torch.Tensor) -> None:
        """Write full rows (latent then rope) of ``loc.numel()`` tokens."""
        # loc: (n,) slots; kv: (n, 1, kv_lora_rank + qk_rope_head_dim) or (n, that width)
        if self._checks:
            check_slots_in_range(loc, self.num_rows, "set_kv_buffer")
        buf = self._kv_buffers[layer]
        rows = kv.to(self._dtype).reshape(kv.shape[0], 1, buf.shape[-1])
        as_raw_words(buf)[loc.long()] = as_raw_words(rows)

    def set_mla_kv_buffer(
        self, layer: int, loc: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor
    ) -> None:
        """Write the latent and the rope part separately (no concatenated temporary)."""
        # loc: (n,); kv_latent: (n, 1, kv_lora_rank); k_rope: (n, 1, qk_rope_head_dim)
        if self._checks:
            check_slots_in_range(loc, self.num_rows, "set_mla_kv_buffer")
        words = as_raw_words(self._kv_buffers[layer])
        index = loc.long()
        rank = self._kv_lora_rank
        n = index.numel()
        words[index, :, :rank] = as_raw_words(kv_latent.to(self._dtype).reshape(n, 1, rank))
        words[index, :, rank:] = as_raw_words(
            k_rope.to(self._dtype).reshape(n, 1, self._qk_rope_head_dim)
        )

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        """``buf[tgt] = buf[src]`` for every layer's buffer, all sources read before any write."""
        # tgt_loc, src_loc: (num_moves,) slots; distinct targets except (0, 0) padding
        if self._layer_num == 0:
            return
        check_move(tgt_loc, src_loc, self._device, self.num_rows, self._checks)
        self._mover.move(self._kv_buffers, tgt_loc, src_loc, independent_groups=independent_groups)
