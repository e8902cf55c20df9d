"""Moves too large for one launch or of odd shapes stay bit-exact: a long cycle
without a hint, tiles past a narrow row, many buffers of odd widths, and launch
shapes reused by moves of the same pair count."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.memory.row_movers import TritonRowMover
from eagletree.domain.kv_move import move_rows_reference
from tests.conftest import requires_triton
from tests.contracts.kv_pool.pools import raw
from tests.contracts.row_mover.movers import (
    NUM_SLOTS,
    assert_moves_like_the_reference,
    compaction_pairs,
    random_buffers,
    slots,
)


@pytest.mark.parametrize("max_staged_moves", [512, 4])  # one segment; gather/scatter
def test_a_long_cycle_without_a_hint_stays_exact(
    max_staged_moves: int, device: torch.device
) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(5)
    cycle = (torch.randperm(NUM_SLOTS - 1, generator=gen)[:40] + 1).tolist()
    tgt, src = cycle, cycle[1:] + cycle[:1]  # one 40-cycle: its closing edge spans every pair
    mover = TritonRowMover(max_staged_moves=max_staged_moves)
    assert_moves_like_the_reference(
        lambda bufs: mover.move(bufs, slots(tgt, device), slots(src, device)),
        slots(tgt, device),
        slots(src, device),
        device,
    )


@pytest.mark.parametrize("max_staged_moves", [512, 4])  # one segment; gather/scatter
def test_tiles_past_a_narrow_row_move_nothing_and_wide_rows_move_exactly(
    max_staged_moves: int, device: torch.device
) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(11)
    num_slots = 24
    wide, narrow = (
        torch.randint(-(2**31), 2**31 - 1, shape, generator=gen, dtype=torch.int32).to(device)
        for shape in [(num_slots, 64), (num_slots,)]
    )
    buffers = (wide, narrow)
    order = torch.randperm(num_slots - 1, generator=gen)[:10] + 1
    tgt, src = order[:8], order[2:10]  # a chain: pair k reads what pair k + 2 writes
    expected = [buf.clone() for buf in buffers]
    move_rows_reference(expected, tgt.to(device), src.to(device))
    # 4-word tiles: 16 tiles per row, 15 of them past the 1-word row of the second buffer
    mover = TritonRowMover(max_staged_moves=max_staged_moves, tile_words=4)
    mover.move(buffers, tgt.to(device), src.to(device))
    for buf, want in zip(buffers, expected, strict=True):
        assert torch.equal(buf, want)


@pytest.mark.parametrize("odd_bytes", [False, True])  # 4-byte words; single bytes
def test_a_grouped_move_over_many_buffers_of_odd_widths_stays_exact(
    odd_bytes: bool, device: torch.device
) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(7)
    rows: list[tuple[tuple[int, ...], torch.dtype]] = [
        ((2, 8), torch.bfloat16),  # 32 B: 16-byte vectors
        ((3,), torch.float32),  # 12 B: single words
        ((), torch.float32),  # one word per slot
        ((16,), torch.int32),  # the widest row: tiles past every other row are masked
    ]
    if odd_bytes:
        rows.append(((5,), torch.uint8))  # every buffer copied as single bytes
    buffers = tuple(
        torch.randint(0, 256, (NUM_SLOTS, max(1, torch.Size(shape).numel()) * dtype.itemsize),
                      generator=gen, dtype=torch.uint8).view(dtype).reshape(NUM_SLOTS, *shape)
        .to(device)
        for _ in range(2)
        for shape, dtype in rows
    )  # fmt: skip
    tgt, src = compaction_pairs(gen, bs=6, num_nodes=8, num_steps=3, device=device)
    expected = [buf.clone() for buf in buffers]
    move_rows_reference(expected, tgt, src)
    # one group of 4 pairs per segment, 16-word register blocks: many segments and tiles
    mover = TritonRowMover(max_staged_moves=8, register_words=64, group_lanes=4)
    mover.move(buffers, tgt, src, independent_groups=4)
    for i, (buf, want) in enumerate(zip(buffers, expected, strict=True)):
        assert torch.equal(raw(buf), raw(want)), f"buffer {i} of {len(buffers)} differs"


def test_moves_of_one_pair_count_reuse_a_launch_shape_and_stay_exact(device: torch.device) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(12)
    mover = TritonRowMover()
    buffers = random_buffers(NUM_SLOTS, device, 3)
    expected = [buf.clone() for buf in buffers]
    for hint in (None, 3, None, 3):  # the same count, new pairs, with and without the hint
        order = torch.randperm(NUM_SLOTS - 1, generator=gen)[:9] + 1
        tgt = order[:6].to(device)
        src = torch.cat([order[1:3], order[6:9], order[5:6]]).to(device)  # chains in groups
        move_rows_reference(expected, tgt, src)
        mover.move(buffers, tgt, src, independent_groups=hint)
        for i, (buf, want) in enumerate(zip(buffers, expected, strict=True)):
            assert torch.equal(raw(buf), raw(want)), f"buffer {i} differs"
