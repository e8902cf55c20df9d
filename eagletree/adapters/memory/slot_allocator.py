"""Adapter: TokenSlotAllocator whose free list is a device-resident stack."""

from __future__ import annotations

from typing import Final

import torch

from eagletree.adapters.memory.pool_rows import checks_by_default
from eagletree.domain.errors import DoubleFree


class DeviceSlotAllocator:
    """Free slots ``1..size`` live in a device tensor used as a stack; the host keeps only a count.

    ``alloc(n)`` copies the top n entries (one small kernel, no host sync) and ``free(slots)``
    writes them back on top (one copy). Slot 0 is never handed out. With checks on (always on
    CPU; ``debug_checks`` on accelerators, because the check reads device values on the host)
    a device mask of free slots catches double frees and out-of-range slots.
    """

    def __init__(self, size: int, device: torch.device | str, debug_checks: bool = False) -> None:
        if size < 1:
            raise ValueError(f"an allocator needs at least one slot, got size={size}")
        self.size: Final = size
        self.device: Final = torch.device(device)
        # free_slots[:num_free] are free; popped from the top, so the first alloc gets 1, 2, …
        self._free_slots = torch.arange(size, 0, -1, dtype=torch.int64, device=self.device)
        self._num_free = size
        # is_free: (size + 1,) bool, slot 0 marked not free so that freeing it is caught
        self._is_free: torch.Tensor | None = None
        if checks_by_default(self.device, debug_checks):
            self._is_free = torch.ones(size + 1, dtype=torch.bool, device=self.device)
            self._is_free[0] = False

    def available_size(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """n distinct free int64 slots (ascending when fresh), or None, taking nothing."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > self._num_free:
            return None
        top = self._num_free
        slots = self._free_slots[top - n : top].flip(0)  # flip copies: the stack may be rewritten
        self._num_free = top - n
        if self._is_free is not None:
            self._is_free[slots] = False
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Return slots; they may be int32 or int64 and on any device."""
        # slots: (n,) slot ids previously handed out by alloc
        on_accelerator = self.device.type != "cpu"
        slots = slots.reshape(-1).to(self.device, torch.int64, non_blocking=on_accelerator)
        n = slots.numel()
        if n == 0:
            return
        if n > self.size - self._num_free:
            raise DoubleFree(
                f"freeing {n} slots but only {self.size - self._num_free} are allocated"
            )
        if self._is_free is not None:
            self._check_allocated(slots)
            self._is_free[slots] = True
        self._free_slots[self._num_free : self._num_free + n] = slots
        self._num_free += n

    def _check_allocated(self, slots: torch.Tensor) -> None:
        assert self._is_free is not None
        # SYNC: debug-only checks (always on CPU) read the slots and the free mask on the host
        low, high = (int(v) for v in torch.aminmax(slots))
        if low < 1 or high > self.size:
            bad = low if low < 1 else high
            raise IndexError(f"slot {bad} is out of range: allocatable slots are [1, {self.size}]")
        already_free = self._is_free[slots]
        if bool(already_free.any()):
            first = int(slots[already_free][0])
            raise DoubleFree(f"slot {first} was freed while already free")
        if torch.unique(slots).numel() != slots.numel():
            raise DoubleFree("the same slot appears twice in one free() call")
