"""Windows grown ahead: every plan the scheduler makes is the one it makes without them (the
slots grown ahead go back before a request waits or is retracted for them), with far fewer
allocations, every window still backed and nothing leaked."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.app.engine.scheduler import PREFILL_STEPS, PrefillStep, Scheduler
from eagletree.domain.request import Request
from tests.hypothesis_profiles import examples

from .test_scheduler import check_slot_ownership, make_request, make_scheduler, simulate_step


class _CountingAllocator(DeviceSlotAllocator):
    """A slot allocator that keeps the size of every allocation."""

    def __init__(self, size: int) -> None:
        super().__init__(size, "cpu")
        self.sizes: list[int] = []

    def alloc(self, n: int) -> torch.Tensor | None:
        self.sizes.append(n)
        return super().alloc(n)


def _scheduler(
    pool_size: int, reserve: int, grow_ahead: int, prefill_step: PrefillStep = "with_decode"
) -> tuple[Scheduler, _CountingAllocator, TensorReqToTokenPool]:
    """A scheduler of 4 rows over ``pool_size`` slots, its allocator counting allocations."""
    allocator = _CountingAllocator(pool_size)
    scheduler, _, table = make_scheduler(
        pool_size=pool_size,
        max_requests=4,
        reserve=reserve,
        max_running=4,
        max_prefill_tokens=32,
        prefill_step=prefill_step,
        grow_ahead=grow_ahead,
        allocator=allocator,
    )
    return scheduler, allocator, table


def _run(
    seed: int,
    reserve: int,
    max_commit: int,
    pool_size: int,
    num_requests: int,
    grow_ahead: int,
    prefill_step: PrefillStep,
) -> tuple[list[tuple[list[int], ...]], int]:
    """Each plan's request ids (prefill, decode, retracted, released, paused) over a workload
    whose requests arrive one by one and some of them are aborted, and how many allocations it
    made; checks the windows and the slots at every step and that nothing is left at the end."""
    rng = random.Random(seed)
    scheduler, allocator, table = _scheduler(pool_size, reserve, grow_ahead, prefill_step)
    requests = [
        make_request(i, prompt_len=rng.randint(1, 12), max_new_tokens=rng.randint(1, 20))
        for i in range(num_requests)
    ]
    arriving = list(requests)
    plans: list[tuple[list[int], ...]] = []
    while arriving or scheduler.has_work():
        if arriving and rng.random() < 0.4:
            scheduler.add(arriving.pop(0))
        if rng.random() < 0.03:
            scheduler.abort(rng.choice(requests).request_id)
        plan = scheduler.schedule()
        for request in plan.decode + plan.paused:
            assert request.allocated_len >= request.committed_len + reserve
            assert request.allocated_len <= scheduler.slots_needed(request.max_total_len)
        check_slot_ownership(scheduler, allocator, table)
        parts: tuple[list[Request], ...] = (
            plan.prefill, plan.decode, plan.retracted, plan.released, plan.paused,
        )  # fmt: skip
        plans.append(tuple([r.request_id for r in part] for part in parts))
        simulate_step(plan, max_commit, rng)
        assert len(plans) < 3000, "no progress"
    scheduler.release_finished()
    assert allocator.available_size() == pool_size
    assert table.available_size() == 4
    assert int(table.req_to_token.count_nonzero()) == 0
    return plans, len(allocator.sizes)


@settings(max_examples=examples(60), deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    reserve_case=st.sampled_from([(1, 1), (4, 2), (8, 4), (12, 6)]),
    pool_size=st.integers(60, 200),
    num_requests=st.integers(1, 10),
    grow_ahead=st.sampled_from([1, 5, 16, 64]),
    prefill_step=st.sampled_from(PREFILL_STEPS),
)
def test_windows_grown_ahead_change_no_plan(
    seed: int,
    reserve_case: tuple[int, int],
    pool_size: int,
    num_requests: int,
    grow_ahead: int,
    prefill_step: PrefillStep,
) -> None:
    # tight pools retract and hold requests waiting for slots: the slots grown ahead go back
    # first, and the scheduler admits, decodes and retracts as it does without them
    reserve, max_commit = reserve_case
    case = (seed, reserve, max_commit, pool_size, num_requests)
    exact, _ = _run(*case, grow_ahead=0, prefill_step=prefill_step)
    ahead, _ = _run(*case, grow_ahead=grow_ahead, prefill_step=prefill_step)
    assert ahead == exact


def _decode_allocations(grow_ahead: int) -> tuple[int, int]:
    """Allocations and steps of 4 requests decoding 30 tokens each, 1 to 4 a step, in a pool
    with room (the prefill's allocation not counted)."""
    scheduler, allocator, _ = _scheduler(400, 8, grow_ahead)
    rng = random.Random(5)
    for request_id in range(4):
        scheduler.add(make_request(request_id, prompt_len=4, max_new_tokens=30))
    simulate_step(scheduler.schedule(), 4, rng)
    before, steps = len(allocator.sizes), 0
    while scheduler.has_work():
        simulate_step(scheduler.schedule(), 4, rng)
        steps += 1
    return len(allocator.sizes) - before, steps


def test_a_roomy_pool_grows_windows_one_step_in_several() -> None:
    allocations, steps = _decode_allocations(grow_ahead=0)
    assert allocations == steps - 1  # every step's but the last, where every request ended
    # 32 slots ahead last 8 steps of 4 tokens at least
    allocations, steps = _decode_allocations(grow_ahead=32)
    assert allocations <= -(-steps // 8)


def _fast_and_slow(pool_size: int, grow_ahead: int) -> tuple[list[list[int]], list[int]]:
    """Two requests in a tight pool, one committing 4 tokens a step, one 1: each step's
    retracted ids and the slow request's window at each of its decode steps; checks that
    ``must_retract`` says before each schedule that released nothing whether it retracts."""
    scheduler, _, _ = _scheduler(pool_size, 8, grow_ahead)
    fast, slow = make_request(0, prompt_len=4, max_new_tokens=36), make_request(1, 4, 36)
    scheduler.add(fast)
    scheduler.add(slow)
    retracted, windows = [], []
    while scheduler.has_work():
        must_retract = scheduler.must_retract()
        plan = scheduler.schedule()
        if not plan.released:
            assert must_retract == bool(plan.retracted)
        retracted.append([r.request_id for r in plan.retracted])
        if slow in plan.decode:
            windows.append(slow.allocated_len)
        for request in plan.prefill:
            request.append_tokens([1], eos_token_ids=(), now=0.0)
            request.commit(request.num_tokens - 1 - request.committed_len)
        for request in plan.decode:
            emitted = 4 if request is fast else 1
            request.append_tokens([1] * emitted, eos_token_ids=(), now=0.0)
            request.commit(min(emitted, request.num_tokens - request.committed_len))
    return retracted, windows


@pytest.mark.parametrize("pool_size", [56, 64])
def test_slots_grown_ahead_go_back_before_a_request_is_retracted(pool_size: int) -> None:
    # the fast request runs short while the slow one holds slots grown ahead: they go back,
    # and the slow request is retracted only where it is without windows grown ahead (56)
    exact, _ = _fast_and_slow(pool_size, grow_ahead=0)
    ahead, windows = _fast_and_slow(pool_size, grow_ahead=16)
    assert ahead == exact
    if not any(exact):  # running all along, the slow window gave back what it had grown ahead
        shrank = [later < earlier for earlier, later in itertools.pairwise(windows)]
        assert any(shrank)


def test_a_negative_grow_ahead_is_refused() -> None:
    with pytest.raises(ValueError, match="grow_ahead=-1 must be >= 0"):
        _scheduler(64, 1, -1)
