"""Adapter: hybrid pool of full-attention and sliding-window layers with separate slot spaces."""

from __future__ import annotations

import torch

from eagletree.adapters.memory.bounds import check_move, check_slots_in_range, same_device
from eagletree.adapters.memory.mha_pool import MHAKVPool


class SWAHybridKVPool:
    """Full-attention layers in ``full``, sliding-window layers in ``swa``; both MHA pools.

    Slots are full-pool slots; ``full_to_swa`` ((full.size + full.page_size,) integer) maps each
    to its SWA slot, 0 for "none" (slot 0 maps to 0). A move moves the full pool by the given
    slots and the SWA pool by the translated ones; a pair whose SWA target is 0 (the token has
    no SWA slot) becomes a (0, 0) no-op there, so no two pairs race on the dummy row. Either
    sub-pool may have zero layers (an all-SWA model has an empty full pool).
    """

    def __init__(self, full: MHAKVPool, swa: MHAKVPool, full_to_swa: torch.Tensor) -> None:
        # full_to_swa: (full.num_rows,) integer full slot -> SWA slot
        if not same_device(full.device, swa.device):
            raise ValueError(f"sub-pools on {full.device} and {swa.device}")
        if full_to_swa.shape != (full.num_rows,):
            raise ValueError(
                f"full_to_swa must have shape ({full.num_rows},), got {tuple(full_to_swa.shape)}"
            )
        if full_to_swa.dtype.is_floating_point or not same_device(full_to_swa.device, full.device):
            raise TypeError(f"full_to_swa must be integer on {full.device}")
        self._full = full
        self._swa = swa
        self._full_to_swa = full_to_swa.long()
        if full.checks_enabled:
            check_slots_in_range(self._full_to_swa, swa.num_rows, "full_to_swa")

    @property
    def full(self) -> MHAKVPool:
        return self._full

    @property
    def swa(self) -> MHAKVPool:
        return self._swa

    @property
    def full_to_swa(self) -> torch.Tensor:
        return self._full_to_swa

    @property
    def size(self) -> int:
        return self._full.size

    @property
    def page_size(self) -> int:
        return self._full.page_size

    @property
    def layer_num(self) -> int:
        return self._full.layer_num + self._swa.layer_num

    @property
    def dtype(self) -> torch.dtype:
        return self._full.dtype

    @property
    def device(self) -> torch.device:
        return self._full.device

    @property
    def num_rows(self) -> int:
        return self._full.num_rows

    def buffers(self) -> list[torch.Tensor]:
        """The full pool's buffers, then the SWA pool's."""
        return self._full.buffers() + self._swa.buffers()

    def translate_loc_from_full_to_swa(self, loc: torch.Tensor) -> torch.Tensor:
        # loc: (n,) full slots -> (n,) int64 SWA slots
        return self._full_to_swa[loc.long()]

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        """Moves the full pool by full slots and the SWA pool by the translated slots."""
        # tgt_loc, src_loc: (num_moves,) full slots; distinct targets except (0, 0) padding
        if self.layer_num == 0:
            return
        check_move(tgt_loc, src_loc, self.device, self.num_rows, self._full.checks_enabled)
        self._full.move_kv_cache(tgt_loc, src_loc, independent_groups=independent_groups)
        if self._swa.layer_num == 0:
            return
        swa_tgt = self.translate_loc_from_full_to_swa(tgt_loc)
        swa_src = torch.where(swa_tgt == 0, 0, self.translate_loc_from_full_to_swa(src_loc))
        # translation keeps each pair in place, so the groups stay independent
        self._swa.move_kv_cache(swa_tgt, swa_src, independent_groups=independent_groups)
