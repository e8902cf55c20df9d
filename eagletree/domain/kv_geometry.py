"""The slot space of a KV pool: how many slots, in pages of what size, over which layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """``size`` allocatable slots (``1..size``) in pages of ``page_size``; every buffer of the pool
    has ``num_rows = size + page_size`` rows, row 0 the dummy. ``layer_num`` may be 0 (a pool with
    nothing to store or move). ``dtype`` is the dtype readers compute in (storage may differ, as
    in an fp8 MHA pool); every buffer lives on ``device``."""

    size: int
    page_size: int
    layer_num: int
    dtype: torch.dtype
    device: torch.device
    # rows per buffer, valid slots [0, num_rows): derived once (the moves read it every step)
    num_rows: int = field(init=False)

    def __post_init__(self) -> None:
        if self.size < 1 or self.layer_num < 0 or self.page_size < 1:
            raise ValueError(
                f"bad pool shape: size={self.size}, layers={self.layer_num}, page={self.page_size}"
            )
        object.__setattr__(self, "num_rows", self.size + self.page_size)
