"""Scheduler: windows ahead of the committed length, no per-step frees, retract, abort, no leaks.

A simulated worker stands in for the model: a prefill commits the whole fill and emits one
token; a decode step commits and emits between 1 and ``max_commit`` tokens (a speculative
worker with a window of ``reserve = 2·max_commit`` does the same), so the properties below hold
for the non-speculative engine and the v2 workers alike.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.scheduler import PREFILL_STEPS, PrefillStep, Scheduler
from eagletree.domain.request import FinishReason, Request, RequestStatus
from eagletree.domain.sampling import SamplingParams
from tests.hypothesis_profiles import examples

CONTEXT = 40


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def make_scheduler(
    pool_size: int = 256,
    max_requests: int = 8,
    reserve: int = 1,
    max_running: int = 8,
    max_prefill_tokens: int = 1024,
    prefill_step: PrefillStep = "with_decode",
    grow_ahead: int = 0,
    allocator: DeviceSlotAllocator | None = None,
) -> tuple[Scheduler, DeviceSlotAllocator, TensorReqToTokenPool]:
    """A scheduler over ``allocator`` (default: a fresh one of ``pool_size`` slots)."""
    allocator = DeviceSlotAllocator(pool_size, "cpu") if allocator is None else allocator
    table = TensorReqToTokenPool(max_requests, CONTEXT + reserve + 4, "cpu")
    scheduler = Scheduler(
        allocator,
        table,
        max_running_requests=max_running,
        reserve_per_step=reserve,
        grow_ahead=grow_ahead,
        max_prefill_tokens=max_prefill_tokens,
        prefill_step=prefill_step,
        clock=Clock(),
    )
    return scheduler, allocator, table


def make_request(request_id: int, prompt_len: int = 4, max_new_tokens: int = 8) -> Request:
    prompt = [(request_id + i) % 17 for i in range(prompt_len)]
    return Request(request_id, prompt, SamplingParams(max_new_tokens=max_new_tokens), CONTEXT)


def simulate_step(plan: SchedulePlan, max_commit: int, rng: random.Random) -> None:
    """What a worker and the engine's commit do to the host state of the plan's requests."""
    for request in plan.prefill:
        assert request.committed_len == 0
        request.append_tokens([rng.randrange(17)], eos_token_ids=(), now=0.0)
        request.commit(request.num_tokens - 1)
    for request in plan.decode:
        emitted = rng.randint(1, max_commit)
        request.append_tokens([rng.randrange(17)] * emitted, eos_token_ids=(), now=0.0)
        request.commit(min(emitted, request.num_tokens - request.committed_len))


def row_slots(table: TensorReqToTokenPool, request: Request) -> list[int]:
    assert request.row is not None
    return table.req_to_token[request.row, : request.allocated_len].tolist()


def check_slot_ownership(
    scheduler: Scheduler, allocator: DeviceSlotAllocator, table: TensorReqToTokenPool
) -> None:
    """Running requests own disjoint non-zero slots that are exactly the allocated ones."""
    owned = [slot for r in scheduler.running for slot in row_slots(table, r)]
    assert 0 not in owned
    assert len(owned) == len(set(owned))
    assert len(owned) == allocator.size - allocator.available_size()


def test_a_new_request_prefills_in_the_iteration_where_running_ones_decode() -> None:
    scheduler, _, _ = make_scheduler()
    rng = random.Random(0)
    first = make_request(0)
    scheduler.add(first)
    simulate_step(scheduler.schedule(), 1, rng)
    second = make_request(1)
    scheduler.add(second)
    plan = scheduler.schedule()
    assert plan.prefill == [second]
    assert plan.decode == [first]


def test_a_prefill_alone_pauses_the_running_requests_for_one_iteration() -> None:
    scheduler, allocator, table = make_scheduler(reserve=3, prefill_step="alone")
    rng = random.Random(0)
    first = make_request(0)
    scheduler.add(first)
    simulate_step(scheduler.schedule(), 2, rng)
    second = make_request(1)
    scheduler.add(second)
    plan = scheduler.schedule()
    assert (plan.prefill, plan.decode, plan.paused) == ([second], [], [first])
    assert plan.live == [second, first]
    assert first.allocated_len >= first.committed_len + 3  # its window stays backed
    check_slot_ownership(scheduler, allocator, table)
    simulate_step(plan, 2, rng)
    plan = scheduler.schedule()  # nothing to admit: everyone decodes
    assert (plan.prefill, plan.decode, plan.paused) == ([], [first, second], [])


def test_an_unknown_prefill_step_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_step='beside' must be one of"):
        make_scheduler(prefill_step="beside")  # type: ignore[arg-type]


def test_windows_reach_the_reserve_past_the_committed_length_and_rows_hold_the_slots() -> None:
    scheduler, allocator, table = make_scheduler(reserve=6)
    rng = random.Random(1)
    for request_id in range(3):
        scheduler.add(make_request(request_id, prompt_len=3 + request_id))
    plan = scheduler.schedule()
    assert [r.allocated_len for r in plan.prefill] == [3, 4, 5]  # just the fill
    simulate_step(plan, 3, rng)
    plan = scheduler.schedule()
    for request in plan.decode:
        assert request.allocated_len == request.committed_len + 6
    check_slot_ownership(scheduler, allocator, table)


@settings(max_examples=examples(40), deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    reserve_case=st.sampled_from([(1, 1), (4, 2), (8, 4), (12, 6)]),
    pool_size=st.integers(60, 160),
    num_requests=st.integers(1, 10),
    prefill_step=st.sampled_from(PREFILL_STEPS),
)
def test_random_workloads_never_free_per_step_and_end_with_every_slot_and_row_free(
    seed: int,
    reserve_case: tuple[int, int],
    pool_size: int,
    num_requests: int,
    prefill_step: PrefillStep,
) -> None:
    reserve, max_commit = reserve_case
    rng = random.Random(seed)
    scheduler, allocator, table = make_scheduler(
        pool_size=pool_size,
        max_requests=4,
        reserve=reserve,
        max_running=4,
        max_prefill_tokens=32,
        prefill_step=prefill_step,
    )
    requests = [
        make_request(i, prompt_len=rng.randint(1, 12), max_new_tokens=rng.randint(1, 20))
        for i in range(num_requests)
    ]
    for request in requests:
        scheduler.add(request)
    steps = 0
    while scheduler.has_work():
        if rng.random() < 0.05:
            scheduler.abort(rng.choice(requests).request_id)
        before = {r.request_id: row_slots(table, r) for r in scheduler.running}
        plan = scheduler.schedule()
        for request in scheduler.running:  # a surviving window only grew: nothing freed per step
            kept = before.get(request.request_id)
            if kept is not None:
                assert row_slots(table, request)[: len(kept)] == kept
        for request in plan.decode + plan.paused:
            assert request.allocated_len >= request.committed_len + reserve
        for request in plan.prefill:
            assert request.allocated_len == request.num_tokens
        assert sorted(r.request_id for r in plan.live) == sorted(
            r.request_id for r in scheduler.running
        )
        if prefill_step == "alone" and plan.prefill:
            assert plan.decode == []
        else:
            assert plan.paused == []
        check_slot_ownership(scheduler, allocator, table)
        simulate_step(plan, max_commit, rng)
        steps += 1
        assert steps < 2000, "no progress"
    scheduler.release_finished()
    assert allocator.available_size() == pool_size
    assert table.available_size() == 4
    assert int(table.req_to_token.count_nonzero()) == 0
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    for request in requests:
        if request.finish_reason is not FinishReason.ABORT:
            assert request.finish_reason is FinishReason.LENGTH
            assert len(request.output_ids) == request.params.max_new_tokens


def test_when_slots_run_out_the_newest_request_is_retracted_with_its_tokens_kept() -> None:
    # three requests of 4 + up to 12 tokens in a pool of 36 slots: they cannot all grow
    scheduler, allocator, table = make_scheduler(pool_size=36, reserve=1)
    rng = random.Random(2)
    requests = [make_request(i, prompt_len=4, max_new_tokens=12) for i in range(3)]
    for request in requests:
        scheduler.add(request)
    retracted: list[Request] = []
    while scheduler.has_work():
        plan = scheduler.schedule()
        if plan.retracted:
            assert plan.prefill == [], "no admission in an iteration that retracted"
            newest = max(plan.retracted, key=lambda r: r.request_id)
            assert scheduler.waiting[0] in plan.retracted
            assert newest.status is RequestStatus.WAITING and newest.num_tokens > 4
            assert newest.fill_ids()[:4] == list(newest.prompt_ids)
            retracted.extend(plan.retracted)
        check_slot_ownership(scheduler, allocator, table)
        simulate_step(plan, 1, rng)
    scheduler.release_finished()
    assert retracted and retracted[0].request_id == 2
    assert all(len(r.output_ids) == 12 for r in requests)
    assert allocator.available_size() == 36
    assert scheduler.stats.num_retracted == len(retracted)


def test_admission_stops_at_max_running_requests_and_at_the_prefill_budget() -> None:
    scheduler, _, _ = make_scheduler(max_running=2)
    for request_id in range(3):
        scheduler.add(make_request(request_id))
    assert [r.request_id for r in scheduler.schedule().prefill] == [0, 1]
    scheduler, _, _ = make_scheduler(max_prefill_tokens=10)
    for request_id in range(3):
        scheduler.add(make_request(request_id, prompt_len=4))
    assert len(scheduler.schedule().prefill) == 2  # 4 + 4 tokens fit the budget of 10, 12 not
    scheduler, _, _ = make_scheduler(max_prefill_tokens=2)
    scheduler.add(make_request(0, prompt_len=4))
    assert len(scheduler.schedule().prefill) == 1  # one request always goes, even over budget


def test_aborting_frees_a_running_request_and_drops_a_waiting_one() -> None:
    scheduler, allocator, table = make_scheduler(max_running=1)
    running, waiting = make_request(0), make_request(1)
    scheduler.add(running)
    scheduler.add(waiting)
    simulate_step(scheduler.schedule(), 1, random.Random(3))
    assert scheduler.abort(0) and scheduler.abort(1)
    assert not scheduler.abort(99)
    plan = scheduler.schedule()
    assert plan.released == [running, waiting]
    assert all(r.finish_reason is FinishReason.ABORT for r in plan.released)
    assert not scheduler.has_work()
    assert allocator.available_size() == allocator.size
    assert table.available_size() == table.size
    assert scheduler.stats.num_aborted == 2


def test_a_request_the_pool_could_never_hold_is_refused_when_added() -> None:
    scheduler, _, _ = make_scheduler(pool_size=16, reserve=4)
    with pytest.raises(ValueError, match=r"request 0: needs up to 19 KV slots"):
        scheduler.add(make_request(0, prompt_len=4, max_new_tokens=12))


def test_rows_are_cleared_when_a_request_leaves() -> None:
    scheduler, _, table = make_scheduler()
    scheduler.add(make_request(0, max_new_tokens=1))
    simulate_step(scheduler.schedule(), 1, random.Random(4))
    assert int(table.req_to_token.count_nonzero()) == 4
    released = scheduler.release_finished()
    assert [r.finish_reason for r in released] == [FinishReason.LENGTH]
    assert torch.count_nonzero(table.req_to_token) == 0
