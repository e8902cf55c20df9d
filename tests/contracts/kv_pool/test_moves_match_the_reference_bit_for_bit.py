"""Every KV pool × row mover × storage dtype must move every buffer it owns exactly like
the reference (``domain.kv_move.move_rows_reference``), bit for bit: random overlapping
moves, compaction-shaped moves (with the workers' grouping hint), pages above one
token, empty moves. Triton movers run under ``TRITON_INTERPRET=1`` on CPU (small
shapes) and natively on CUDA."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.contracts.kv_pool.moves import accepted_path_moves, compaction_plan, move_sets
from tests.contracts.kv_pool.pools import (
    FAST,
    MOVERS,
    POOLS,
    SIZE,
    assert_bytes_equal,
    fill_random,
    fill_slot_ids,
    make_pool,
    needs_triton,
    pool_matrix,
    raw,
    reference_move,
    slots,
)


@pool_matrix
@FAST
@given(moves=move_sets(), seed=st.integers(0, 2**16))
def test_random_overlapping_moves_match_the_reference_bit_for_bit(
    pool_kind: str,
    mover_name: str,
    dtype_name: str,
    device: torch.device,
    moves: tuple[list[int], list[int]],
    seed: int,
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), dtype_name, device)
    fill_random(pool, seed)
    tgt, src = slots(moves[0], device), slots(moves[1], device, torch.int32)
    expected = reference_move(pool, tgt.long(), src.long())
    pool.move_kv_cache(tgt, src)
    assert_bytes_equal(pool, expected)


@pool_matrix
def test_every_buffer_the_pool_owns_receives_its_source_rows(
    pool_kind: str, mover_name: str, dtype_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), dtype_name, device)
    fill_slot_ids(pool)
    # A compaction-shaped move: path [0, 2, 5] in a window, a 3-cycle, a chain and padding.
    tgt = [4, 5, 6, 10, 11, 12, 20, 21, 0, 0]
    src = [4, 6, 9, 11, 12, 10, 21, 22, 0, 0]
    before = [raw(buf).clone() for buf in pool.buffers()]
    pool.move_kv_cache(slots(tgt, device), slots(src, device))
    moved = dict(zip(tgt, src, strict=True))
    for b, (buf, old) in enumerate(zip(pool.buffers(), before, strict=True)):
        for row in range(buf.shape[0]):
            want = old[moved.get(row, row)]
            assert torch.equal(raw(buf)[row], want), f"buffer {b}, row {row}"


@pytest.mark.parametrize("pool_kind", POOLS)
@pytest.mark.parametrize("mover_name", list(MOVERS))
def test_a_page_size_above_one_moves_token_rows(
    pool_kind: str, mover_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), "fp16", device, page_size=4)
    fill_random(pool, 3)
    tgt, src = slots([25, 26, 1, 2], device), slots([26, 1, 3, 25], device)
    expected = reference_move(pool, tgt, src)
    pool.move_kv_cache(tgt, src)
    assert all(buf.shape[0] == SIZE + 4 for buf in pool.buffers())
    assert_bytes_equal(pool, expected)


@pytest.mark.parametrize("pool_kind", POOLS)
@pytest.mark.parametrize("mover_name", list(MOVERS))
def test_an_empty_move_changes_nothing(
    pool_kind: str, mover_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), "bf16", device)
    fill_random(pool, 5)
    before = [raw(buf).clone() for buf in pool.buffers()]
    empty = torch.empty(0, dtype=torch.int64, device=device)
    pool.move_kv_cache(empty, empty)
    assert_bytes_equal(pool, before)


@pytest.mark.parametrize("mover_name", list(MOVERS))
def test_compaction_plans_of_many_requests_match_the_reference(
    mover_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool("mha", MOVERS[mover_name](), "bf16", device)
    tgt, src = compaction_plan(num_requests=3, window=7, depth=3, seed=1)
    fill_random(pool, 9)
    expected = reference_move(pool, slots(tgt, device), slots(src, device))
    pool.move_kv_cache(slots(tgt, device), slots(src, device))
    assert_bytes_equal(pool, expected)


@pool_matrix
def test_compaction_moves_with_the_workers_grouping_hint_match_the_reference(
    pool_kind: str, mover_name: str, dtype_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), dtype_name, device)
    fill_random(pool, 13)
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):  # the workers' call: groups of S + 1 = 4 pairs, one request each
        tgt, src = accepted_path_moves(gen, 4, 5, 3, SIZE + 1, device)
        expected = reference_move(pool, tgt, src)
        pool.move_kv_cache(tgt, src, independent_groups=4)
        assert_bytes_equal(pool, expected)
