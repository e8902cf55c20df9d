"""RowSlots: the KV slots behind each request's req_to_token row — grown, given back, freed.

The scheduler decides how long each window should be; this is where a decision meets the
slot allocator and the req_to_token table. Every operation batches its rows' cells into one
allocation or one free, and clears the cells it frees, so a freed slot is never read through a
stale row. A slot id indexes every KV pool and a row id every runner's view of the request.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eagletree.app.engine.transfers import to_device
from eagletree.domain.errors import OutOfSlots
from eagletree.domain.request import Request
from eagletree.ports.memory import ReqToTokenPool, TokenSlotAllocator


class RowSlots:
    """The slot side of ``allocator`` and ``req_to_token_pool``'s rows."""

    def __init__(self, allocator: TokenSlotAllocator, req_to_token_pool: ReqToTokenPool) -> None:
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool

    def grow(self, targets: Sequence[tuple[Request, int]]) -> None:
        """Back ``req_to_token[row, allocated:target]`` with fresh slots, in one allocation."""
        growing = [(r, target) for r, target in targets if target > r.allocated_len]
        if not growing:
            return
        flat_cells = self._cells([(r, r.allocated_len, target) for r, target in growing])
        total = flat_cells.numel()
        slots = self.allocator.alloc(total)
        if slots is None:
            raise OutOfSlots(total, self.allocator.available_size())
        table = self.req_to_token_pool.req_to_token
        table.view(-1)[flat_cells] = slots.to(table.dtype)
        for request, target in growing:
            request.grow_window(target)

    def give_back(self, ends: Sequence[tuple[Request, int]]) -> int:
        """Give back ``req_to_token[row, end:allocated]`` of each ``(request, end)`` (its window
        tail, never its committed prefix), in one free; returns how many slots."""
        if not ends:
            return 0
        flat_cells = self._cells([(r, end, r.allocated_len) for r, end in ends])
        for request, end in ends:
            request.shrink_window(end)
        table = self.req_to_token_pool.req_to_token
        slots = table.view(-1)[flat_cells].to(torch.int64)  # a copy: the cells are cleared next
        table.view(-1)[flat_cells] = 0
        self.allocator.free(slots)
        return flat_cells.numel()

    def free_row(self, request: Request) -> None:
        """Free the request's row and every slot of it, committed prefix and window tail alike."""
        row, allocated = request.release()
        table = self.req_to_token_pool.req_to_token
        if allocated:
            slots = table[row, :allocated].to(torch.int64)  # a copy: the row is cleared next
            table[row, :allocated] = 0
            self.allocator.free(slots)
        self.req_to_token_pool.free([row])

    def _cells(self, spans: Sequence[tuple[Request, int, int]]) -> torch.Tensor:
        """The flat req_to_token cells of columns ``[start, end)`` of each ``(request, start,
        end)``'s row, on the table's device (n,) int64: built in Python, a few hundred ints
        cost less host time than a chain of small torch calls."""
        table = self.req_to_token_pool.req_to_token
        width = table.shape[1]
        cells: list[int] = []
        for request, start, end in spans:
            assert request.row is not None, request
            base = request.row * width
            cells.extend(range(base + start, base + end))
        return to_device(torch.tensor(cells, dtype=torch.int64), table.device)


def free_window_tail(
    request: Request,
    new_allocated_len: int,
    allocator: TokenSlotAllocator,
    req_to_token_pool: ReqToTokenPool,
) -> None:
    """Give the slots of ``req_to_token[row, new_allocated_len:allocated]`` back and clear them.

    The per-step free of the v1 worker: after it has moved the accepted slots to the front of
    the window, the rejected ones form the tail. The committed prefix is never freed this way
    (``Request.shrink_window`` checks it); the scheduler grows the window again next step.
    """
    assert request.row is not None, request
    start, end = new_allocated_len, request.allocated_len
    request.shrink_window(new_allocated_len)
    if end > start:
        table = req_to_token_pool.req_to_token
        slots = table[request.row, start:end].to(torch.int64)  # a copy: cleared next
        table[request.row, start:end] = 0
        allocator.free(slots)
