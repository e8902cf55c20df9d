"""Adapter: ReqToTokenPool as a device int32 table with a host free list of request rows."""

from __future__ import annotations

from typing import Final

import torch

from eagletree.domain.errors import DoubleFree


class TensorReqToTokenPool:
    """``req_to_token[row, position]`` = KV slot id; rows are handed out and taken back on the host.

    Size rows as ``max_context_len + headroom`` (the v2 step over-allocates
    ``2·max(S·k, N)`` slots past the committed length). Row contents are not cleared on free:
    a request writes its positions before any kernel reads them.
    """

    def __init__(self, max_requests: int, row_width: int, device: torch.device | str) -> None:
        if max_requests < 1 or row_width < 1:
            raise ValueError(f"bad table shape ({max_requests}, {row_width})")
        self.size: Final = max_requests
        self.row_width: Final = row_width
        self.device: Final = torch.device(device)
        # req_to_token: (max_requests, row_width) int32 slot ids
        self.req_to_token: Final = torch.zeros(
            max_requests, row_width, dtype=torch.int32, device=self.device
        )
        self._free_rows = list(range(max_requests - 1, -1, -1))  # pop() hands out 0, 1, 2, …
        self._is_free = [True] * max_requests

    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self, n: int) -> list[int] | None:
        """n free row indices, or None when fewer are free (then nothing is taken)."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} rows")
        if n > len(self._free_rows):
            return None
        rows = [self._free_rows.pop() for _ in range(n)]
        for row in rows:
            self._is_free[row] = False
        return rows

    def free(self, rows: list[int]) -> None:
        """Return rows; a free row (or one listed twice) raises DoubleFree and frees nothing."""
        seen: set[int] = set()
        for row in rows:
            if not 0 <= row < self.size:
                raise IndexError(f"row {row} is out of range: valid rows are [0, {self.size})")
            if self._is_free[row] or row in seen:
                raise DoubleFree(f"request row {row} was freed while already free")
            seen.add(row)
        for row in rows:
            self._is_free[row] = True
            self._free_rows.append(row)
