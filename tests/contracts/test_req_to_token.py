"""Every ReqToTokenPool adapter must pass every test here; a new adapter joins ADAPTERS."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.domain.errors import DoubleFree
from eagletree.ports.memory import ReqToTokenPool

ROWS, WIDTH = 6, 40
MakePool = Callable[[int, int, torch.device], ReqToTokenPool]  # (rows, width, device)
ADAPTERS: list[MakePool] = [TensorReqToTokenPool]


@pytest.fixture(params=ADAPTERS, ids=lambda make: make.__name__)
def pool(request: pytest.FixtureRequest, device: torch.device) -> ReqToTokenPool:
    make: MakePool = request.param
    return make(ROWS, WIDTH, device)


def test_the_table_is_int32_rows_by_width_on_the_device(
    pool: ReqToTokenPool, device: torch.device
) -> None:
    table = pool.req_to_token
    assert table.dtype == torch.int32 and tuple(table.shape) == (ROWS, WIDTH)
    assert table.device.type == device.type
    assert pool.size == ROWS and pool.available_size() == ROWS


def test_alloc_returns_distinct_rows_and_none_when_too_few_are_free(pool: ReqToTokenPool) -> None:
    first = pool.alloc(4)
    assert first is not None and len(set(first)) == 4
    assert all(0 <= row < ROWS for row in first)
    assert pool.alloc(3) is None
    assert pool.available_size() == 2
    rest = pool.alloc(2)
    assert rest is not None and sorted(first + rest) == list(range(ROWS))
    assert pool.alloc(0) == []


def test_rows_hold_slot_ids_written_by_position(pool: ReqToTokenPool, device: torch.device) -> None:
    rows = pool.alloc(2)
    assert rows is not None
    slots = torch.arange(100, 110, dtype=torch.int32, device=device)
    pool.req_to_token[rows[1], 5:15] = slots
    assert torch.equal(pool.req_to_token[rows[1], 5:15], slots)


def test_freeing_a_free_row_is_a_double_free_and_frees_nothing(pool: ReqToTokenPool) -> None:
    rows = pool.alloc(3)
    assert rows is not None
    pool.free(rows[:1])
    with pytest.raises(DoubleFree, match=f"row {rows[0]}"):
        pool.free([rows[1], rows[0]])
    with pytest.raises(DoubleFree):
        pool.free([rows[2], rows[2]])
    assert pool.available_size() == ROWS - 2
    pool.free(rows[1:])
    assert pool.available_size() == ROWS


def test_freeing_an_unknown_row_raises_index_error(pool: ReqToTokenPool) -> None:
    with pytest.raises(IndexError, match=rf"row {ROWS} .*\[0, {ROWS}\)"):
        pool.free([ROWS])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=st.lists(st.tuples(st.booleans(), st.integers(0, ROWS + 1)), max_size=25))
def test_any_alloc_free_sequence_restores_the_free_count(
    pool: ReqToTokenPool, program: list[tuple[bool, int]]
) -> None:
    start = pool.available_size()  # the fixture is shared by hypothesis examples: start from it
    live: list[list[int]] = []
    for is_alloc, arg in program:
        if is_alloc:
            rows = pool.alloc(arg)
            if rows is None:
                assert arg > pool.available_size()
                continue
            assert not set(rows) & {r for block in live for r in block}
            live.append(rows)
        elif live:
            pool.free(live.pop(arg % len(live)))
        assert pool.available_size() == start - sum(map(len, live))
    for block in live:
        pool.free(block)
    assert pool.available_size() == start == ROWS
