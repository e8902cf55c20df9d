"""Adapter helper: argument and slot-range checks shared by the KV pools."""

from __future__ import annotations

import torch


def checks_by_default(device: torch.device, debug_checks: bool) -> bool:
    """Range checks read device values on the host: always on CPU (free), opt-in on accelerators."""
    return debug_checks or device.type == "cpu"


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` name one device when the current device is 0; compare loosely."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def check_move_args(tgt: torch.Tensor, src: torch.Tensor, device: torch.device) -> None:
    """Shape, dtype and device of a (tgt, src) move; host metadata only, never synchronises."""
    # tgt, src: (num_moves,) integer slot ids
    if tgt.dim() != 1 or tgt.shape != src.shape:
        raise ValueError(
            f"tgt and src must be 1-D of one shape, got {tuple(tgt.shape)} and {tuple(src.shape)}"
        )
    for name, slots in (("tgt", tgt), ("src", src)):
        if slots.dtype.is_floating_point or slots.dtype.is_complex or slots.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer slot ids, got {slots.dtype}")
        if not same_device(slots.device, device):
            raise ValueError(f"{name} is on {slots.device}, the pool on {device}")


def check_slots_in_range(slots: torch.Tensor, num_rows: int, what: str) -> None:
    """Raise IndexError naming the first offending value and the valid range ``[0, num_rows)``."""
    # slots: (n,) integer slot ids
    if slots.numel() == 0:
        return
    lowest, highest = torch.aminmax(slots)
    low, high = int(lowest), int(highest)  # SYNC: bounds check, only on CPU or in debug mode
    if low < 0 or high >= num_rows:
        bad = low if low < 0 else high
        raise IndexError(f"{what} slot {bad} is out of range: valid slots are [0, {num_rows})")


def check_move(
    tgt: torch.Tensor, src: torch.Tensor, device: torch.device, num_rows: int, checks: bool
) -> None:
    """What every pool checks before a move: the arguments always, slot ranges when ``checks``."""
    check_move_args(tgt, src, device)
    if checks:
        check_slots_in_range(tgt, num_rows, "move_kv_cache target")
        check_slots_in_range(src, num_rows, "move_kv_cache source")
