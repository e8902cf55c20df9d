"""Every TokenSlotAllocator adapter must pass every test here; a new adapter joins ADAPTERS."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.domain.errors import DoubleFree
from eagletree.ports.memory import TokenSlotAllocator

SIZE = 16
# (size, device, debug_checks) -> allocator; checks on so that double frees are caught on CUDA too
MakeAllocator = Callable[[int, torch.device, bool], TokenSlotAllocator]
ADAPTERS: list[MakeAllocator] = [DeviceSlotAllocator]


@pytest.fixture(params=ADAPTERS, ids=lambda make: make.__name__)
def make(request: pytest.FixtureRequest) -> MakeAllocator:
    factory: MakeAllocator = request.param
    return factory


@pytest.fixture
def allocator(make: MakeAllocator, device: torch.device) -> TokenSlotAllocator:
    return make(SIZE, device, True)


def as_list(slots: torch.Tensor | None) -> list[int]:
    assert slots is not None
    values: list[int] = slots.tolist()
    return values


def test_starts_with_every_slot_but_the_dummy_free(allocator: TokenSlotAllocator) -> None:
    assert allocator.size == SIZE
    assert allocator.available_size() == SIZE


def test_hands_out_slots_one_to_size_and_never_slot_zero(
    allocator: TokenSlotAllocator, device: torch.device
) -> None:
    slots = allocator.alloc(SIZE)
    assert slots is not None
    assert slots.dtype == torch.int64 and slots.dim() == 1 and slots.device.type == device.type
    assert sorted(as_list(slots)) == list(range(1, SIZE + 1))
    assert allocator.available_size() == 0


def test_asking_for_more_than_is_free_returns_none_and_takes_nothing(
    allocator: TokenSlotAllocator,
) -> None:
    first = as_list(allocator.alloc(SIZE - 3))
    assert allocator.alloc(4) is None
    assert allocator.available_size() == 3
    rest = as_list(allocator.alloc(3))
    assert sorted(first + rest) == list(range(1, SIZE + 1))


def test_zero_slots_is_a_valid_request(allocator: TokenSlotAllocator) -> None:
    assert as_list(allocator.alloc(0)) == []
    assert allocator.available_size() == SIZE


def test_freed_slots_are_handed_out_again(allocator: TokenSlotAllocator) -> None:
    everything = allocator.alloc(SIZE)
    assert everything is not None
    allocator.free(everything[3:7].to(torch.int32))  # int32 slot ids are accepted too
    assert allocator.available_size() == 4
    assert sorted(as_list(allocator.alloc(4))) == sorted(as_list(everything[3:7]))


def test_a_returned_tensor_is_not_changed_by_later_frees(allocator: TokenSlotAllocator) -> None:
    first = allocator.alloc(4)
    assert first is not None
    kept = as_list(first)
    second = allocator.alloc(4)
    assert second is not None
    allocator.free(second)
    allocator.free(first[:2])
    assert as_list(first) == kept


def test_freeing_a_free_slot_is_a_double_free(allocator: TokenSlotAllocator) -> None:
    slots = allocator.alloc(3)
    assert slots is not None
    allocator.free(slots[:1])
    with pytest.raises(DoubleFree, match=f"slot {int(slots[0])}"):
        allocator.free(slots[:2])
    with pytest.raises(DoubleFree):
        allocator.free(torch.stack([slots[2], slots[2]]))
    assert allocator.available_size() == SIZE - 2


def test_freeing_more_slots_than_are_allocated_is_caught_without_checks(
    make: MakeAllocator, device: torch.device
) -> None:
    allocator = make(SIZE, device, False)
    slots = allocator.alloc(2)
    assert slots is not None
    allocator.free(slots)
    with pytest.raises(DoubleFree):
        allocator.free(slots)
    assert allocator.available_size() == SIZE


@pytest.mark.parametrize("bad", [0, SIZE + 1, -2])
def test_freeing_a_slot_outside_one_to_size_raises_index_error(
    allocator: TokenSlotAllocator, device: torch.device, bad: int
) -> None:
    allocator.alloc(SIZE)
    with pytest.raises(IndexError, match=rf"slot {bad} .*\[1, {SIZE}\]"):
        allocator.free(torch.tensor([bad], device=device))
    assert allocator.available_size() == 0


@st.composite
def alloc_free_programs(draw: st.DrawFn) -> list[tuple[str, int]]:
    """("alloc", n) or ("free", k): free the k-th live allocation (mod their number)."""
    step = st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, SIZE + 2)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    )
    return draw(st.lists(step, max_size=25))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=alloc_free_programs())
def test_any_alloc_free_sequence_keeps_slots_disjoint_and_restores_the_count(
    make: MakeAllocator, device: torch.device, program: list[tuple[str, int]]
) -> None:
    allocator = make(SIZE, device, True)
    live: list[list[int]] = []
    for op, arg in program:
        if op == "alloc":
            before = allocator.available_size()
            slots = allocator.alloc(arg)
            if arg > before:
                assert slots is None and allocator.available_size() == before
                continue
            got = as_list(slots)
            assert len(got) == arg and 0 not in got and all(1 <= s <= SIZE for s in got)
            assert not set(got) & {s for block in live for s in block}
            live.append(got)
        elif live:
            block = live.pop(arg % len(live))
            allocator.free(torch.tensor(block, device=device))
        assert allocator.available_size() == SIZE - sum(map(len, live))
    for block in live:
        allocator.free(torch.tensor(block, device=device))
    assert allocator.available_size() == SIZE
    assert sorted(as_list(allocator.alloc(SIZE))) == list(range(1, SIZE + 1))
