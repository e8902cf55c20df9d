"""Adapter helper: what the KV pools share about slot rows — argument and slot-range checks, the
checked move, and integer views of any dtype that make row copies bit-exact."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Sequence

    from eagletree.domain.kv_geometry import KVGeometry
    from eagletree.ports.memory import RowMover


def checks_by_default(device: torch.device, debug_checks: bool) -> bool:
    """Range checks read device values on the host: always on CPU (free), opt-in on accelerators."""
    return debug_checks or device.type == "cpu"


def _same_device(a: torch.device, b: torch.device) -> bool:
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
        if not _same_device(slots.device, device):
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


def checked_move(
    mover: RowMover,
    buffers: Sequence[torch.Tensor],
    geometry: KVGeometry,
    checks: bool,
    tgt: torch.Tensor,
    src: torch.Tensor,
    independent_groups: int | None,
) -> None:
    """Every pool's ``move_kv_cache``: nothing for a pool without layers; else the arguments
    (always) and the slot ranges (when ``checks``), then one mover call over all the buffers."""
    # tgt, src: (num_moves,) slots; distinct targets except (0, 0) padding
    if geometry.layer_num == 0:
        return
    check_move_args(tgt, src, geometry.device)
    if checks:
        check_slots_in_range(tgt, geometry.num_rows, "move_kv_cache target")
        check_slots_in_range(src, geometry.num_rows, "move_kv_cache source")
    mover.move(buffers, tgt, src, independent_groups=independent_groups)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_raw_words(buf: torch.Tensor) -> torch.Tensor:
    """The same memory as an integer tensor of the same element size (a view, no copy).

    Index kernels are missing for some dtypes (float8 on CPU) and a float copy could in principle
    canonicalise NaN payloads; integer views have neither problem.
    """
    word = _SAME_SIZE_INT.get(buf.element_size())
    if word is None:
        raise TypeError(
            f"cannot move rows of dtype {buf.dtype} (element size {buf.element_size()})"
        )
    return buf if buf.dtype == word else buf.view(word)
