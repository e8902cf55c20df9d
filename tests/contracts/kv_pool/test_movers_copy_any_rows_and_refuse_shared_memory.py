"""RowMovers copy rows of any shape, dtype and stride like the reference, and the
Triton mover refuses buffers that share memory."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from eagletree.adapters.memory.row_movers import TritonRowMover
from eagletree.domain.kv_move import move_rows_reference
from tests.conftest import requires_triton
from tests.contracts.kv_pool.moves import move_sets
from tests.contracts.kv_pool.pools import FAST, MOVERS, needs_triton, raw, slots


@pytest.mark.parametrize("mover_name", list(MOVERS))
@FAST
@given(moves=move_sets(num_rows=30), seed=st.integers(0, 2**16))
def test_movers_copy_rows_of_any_shape_dtype_and_stride(
    mover_name: str, device: torch.device, moves: tuple[list[int], list[int]], seed: int
) -> None:
    needs_triton(mover_name, device)
    gen = torch.Generator().manual_seed(seed)
    padded = torch.randn(30, 6, generator=gen).to(device)
    buffers = (
        torch.randint(0, 256, (30, 5), generator=gen, dtype=torch.uint8).to(device),  # odd bytes
        torch.randn(30, generator=gen).to(device),  # one scalar per slot
        torch.randn(30, 3, 3, generator=gen).to(device, torch.float16),
        torch.randn(30, 2, generator=gen).to(device, torch.float64),
        padded[:, :4],  # rows contiguous, slot stride wider than a row
        torch.randn(30, 3, generator=gen).to(device)[:, 1],  # one element per slot, strided
    )
    tgt, src = slots(moves[0], device), slots(moves[1], device)
    expected = [buf.clone() for buf in buffers]
    move_rows_reference(expected, tgt, src)
    MOVERS[mover_name]().move(buffers, tgt, src)
    for buf, want in zip(buffers, expected, strict=True):
        assert torch.equal(raw(buf.contiguous()), raw(want.contiguous()))


def test_the_triton_mover_rejects_buffers_that_share_memory(device: torch.device) -> None:
    requires_triton(device)
    kv = torch.zeros(8, 2, 4, device=device)
    with pytest.raises(ValueError, match="overlap"):
        TritonRowMover().move((kv, kv[:, 1]), slots([1], device), slots([2], device))
