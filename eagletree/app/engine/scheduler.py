"""Scheduler: continuous batching over req_to_token rows and KV slot windows; retract and abort.

Each iteration ``schedule()`` (1) releases requests that finished or were aborted, (2) grows the
window of every running request to at least ``committed + reserve_per_step`` slots — all of them
``grow_ahead`` further once one falls short, while no request waits and the pool affords it, so
that windows grow one step in several; giving those back, then retracting the newest running
requests, while the pool is short — and (3) admits waiting requests for prefill while rows,
slots and the prefill token budget last (not in an iteration that retracted), a window's slots
grown ahead given back before a request waits for them.
With ``prefill_step = "alone"`` an iteration that admits runs its prefills as a step of their
own: the running requests sit it out (``SchedulePlan.paused``) and decode in the next one.

Slots are not freed per step: a request's whole row ``[0, allocated)`` — the committed prefix
and the window tail ``[committed, allocated)`` — goes back to the allocator exactly once, when
it finishes, is aborted or is retracted, but for the tail grown ahead, given back under
pressure. (The v1 worker alone also frees its rejected draft slots every step, through
``free_window_tail``; it grows nothing ahead.) With ``reserve_per_step = 2·max(S·k, N)`` a
speculative worker can run a step on device-side lengths the host learns one step later.
Every runner of one engine shares the req_to_token pool given here (a slot id indexes every
KV pool; a row id indexes every runner's view of the request). The scheduler decides each
window's length; ``RowSlots`` (``row_slots.py``) backs, gives back and frees the slots.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.row_slots import RowSlots, free_window_tail
from eagletree.domain.errors import OutOfSlots
from eagletree.domain.request import FinishReason, Request, RequestStatus
from eagletree.ports.memory import ReqToTokenPool, TokenSlotAllocator

# where a plan's prefills run: in the step of its decode batch, or in a step of their own
PrefillStep = Literal["with_decode", "alone"]
PREFILL_STEPS: tuple[PrefillStep, ...] = get_args(PrefillStep)


@dataclass(slots=True)
class SchedulerStats:
    num_admitted: int = 0
    num_retracted: int = 0
    num_aborted: int = 0
    num_finished: int = 0


class Scheduler:
    """FIFO admission, newest-first retraction, one req_to_token row and slot window per request."""

    def __init__(
        self,
        allocator: TokenSlotAllocator,
        req_to_token_pool: ReqToTokenPool,
        *,
        max_running_requests: int,
        reserve_per_step: int = 1,
        grow_ahead: int = 0,
        max_prefill_tokens: int = 16_384,
        prefill_step: PrefillStep = "with_decode",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if prefill_step not in PREFILL_STEPS:
            raise ValueError(f"prefill_step={prefill_step!r} must be one of {PREFILL_STEPS}")
        if grow_ahead < 0:
            raise ValueError(f"grow_ahead={grow_ahead} must be >= 0")
        if reserve_per_step < 1 or max_running_requests < 1 or max_prefill_tokens < 1:
            raise ValueError(
                f"reserve_per_step={reserve_per_step}, max_running_requests="
                f"{max_running_requests}, max_prefill_tokens={max_prefill_tokens} must be >= 1"
            )
        self._allocator = allocator
        self._req_to_token_pool = req_to_token_pool
        self._slots = RowSlots(allocator, req_to_token_pool)
        self.max_running_requests = max_running_requests
        self.reserve_per_step = reserve_per_step
        self.grow_ahead = grow_ahead
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_step: PrefillStep = prefill_step
        self._clock = clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last one is the newest
        self.stats = SchedulerStats()

    @property
    def allocator(self) -> TokenSlotAllocator:
        return self._allocator

    @property
    def req_to_token_pool(self) -> ReqToTokenPool:
        return self._req_to_token_pool

    # -- capacity --------------------------------------------------------------------------------

    def slots_needed(self, max_total_len: int) -> int:
        """Most slots a request of at most ``max_total_len`` tokens ever holds at once.

        Its last token is never written to the pools, so it commits at most
        ``max_total_len - 1`` tokens, and its window reaches ``reserve_per_step`` past them.
        """
        return max_total_len - 1 + self.reserve_per_step

    def capacity_problem(self, max_total_len: int) -> str | None:
        """Why the pools could never hold a request of ``max_total_len`` tokens alone, or None."""
        needed = self.slots_needed(max_total_len)
        if needed > self._allocator.size:
            return (
                f"needs up to {needed} KV slots ({max_total_len} tokens of prompt and output + "
                f"{self.reserve_per_step} reserved per step) but the pool has "
                f"{self._allocator.size} (memory.max_total_tokens)"
            )
        row_width = int(self._req_to_token_pool.req_to_token.shape[1])
        if needed > row_width:
            return f"needs {needed} req_to_token columns but rows have {row_width}"
        return None

    # -- queue -----------------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        assert request.status is RequestStatus.WAITING, request
        problem = self.capacity_problem(request.max_total_len)
        if problem is not None:
            raise ValueError(f"request {request.request_id}: {problem}")
        self.waiting.append(request)

    def abort(self, request_id: int) -> bool:
        """Mark a queued or running request aborted; it is released at the next ``schedule``."""
        for request in self._unfinished():
            if request.request_id == request_id:
                request.mark_aborted()
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _unfinished(self) -> Iterator[Request]:
        yield from self.running
        yield from self.waiting

    # -- one iteration ---------------------------------------------------------------------------

    def schedule(self) -> SchedulePlan:
        released = self.release_finished()
        retracted = self._reserve_decode_windows()
        decode = list(self.running)
        prefill = [] if retracted else self._admit()
        if prefill and self.prefill_step == "alone":  # the running ones decode next step
            return SchedulePlan(prefill, [], retracted, released, paused=decode)
        return SchedulePlan(prefill, decode, retracted, released)

    def release_finished(self) -> list[Request]:
        """Free the rows and windows of finished or aborted requests; mark them FINISHED."""
        now = self._clock()
        released = [r for r in self._unfinished() if r.finish_reason is not None]
        for request in released:
            if request.status is RequestStatus.RUNNING:
                self.running.remove(request)
                self._slots.free_row(request)
            else:
                self.waiting.remove(request)
            if request.finish_reason is FinishReason.ABORT:
                self.stats.num_aborted += 1
            self.stats.num_finished += 1
            request.finish(now)
        return released

    def _reserve_decode_windows(self) -> list[Request]:
        """Grow every running window to at least committed + reserve (``_window_targets``);
        give back the slots grown ahead, then retract the newest, while the pool is short."""
        retracted: list[Request] = []
        while True:
            shortfall = sum(self._window_shortfall(r) for r in self.running)
            available = self._allocator.available_size()
            if shortfall <= available:
                break
            if self._trim_windows():  # slots freed
                continue
            if len(self.running) == 1:  # cannot happen for requests `add` accepted
                raise OutOfSlots(shortfall, available)
            victim = self.running.pop()
            self._slots.free_row(victim)
            victim.retract()
            self.waiting.appendleft(victim)  # the oldest retracted ends up first in line
            self.stats.num_retracted += 1
            retracted.append(victim)
        if shortfall:
            self._slots.grow(self._window_targets(available))
        return retracted

    def _window_targets(self, available: int) -> list[tuple[Request, int]]:
        """The length each running window grows to, some of them being short: ``grow_ahead``
        slots past committed + reserve for every one (never past what the request can ever
        hold) while no request waits and the pool affords it, else committed + reserve.
        Growing costs the host a handful of torch calls and a Python pass over the batch's
        new cells, whatever it grows by: grown ahead, the windows grow together one step in
        several (at bs 64 on the CPU: 108 µs a step of growing every window by its step's
        tokens, against 20 with nothing to grow)."""
        reserve = self.reserve_per_step
        if self.grow_ahead and not self.waiting:
            ahead = reserve + self.grow_ahead
            targets = [
                (r, min(r.committed_len + ahead, self.slots_needed(r.max_total_len)))
                for r in self.running
            ]
            if sum(max(0, t - r.allocated_len) for r, t in targets) <= available:
                return targets
        return [(r, r.committed_len + reserve) for r in self.running]

    def _trim_windows(self) -> int:
        """Give back the slots of every running window past committed + reserve (those grown
        ahead), in one free; returns how many."""
        reserve = self.reserve_per_step
        return self._slots.give_back(
            [
                (r, r.committed_len + reserve)
                for r in self.running
                if r.allocated_len > r.committed_len + reserve
            ]
        )

    def must_retract(self) -> bool:
        """Whether the next ``schedule`` would retract: the running windows cannot all grow,
        even with the slots grown ahead given back."""
        reserve = self.reserve_per_step
        shortfall = ahead = 0
        for r in self.running:
            extra = r.allocated_len - r.committed_len - reserve
            if extra < 0:
                shortfall -= extra
            else:
                ahead += extra
        return shortfall > self._allocator.available_size() + ahead

    def _window_shortfall(self, request: Request) -> int:
        return max(0, request.committed_len + self.reserve_per_step - request.allocated_len)

    def _admit(self) -> list[Request]:
        """Admit waiting requests in arrival order while a row, slots and the budget last.

        Each admitted request takes slots for its prefill and keeps ``reserve_per_step`` more
        (for itself and each running request) free for the next step, so that admitting it does
        not force a retraction right away.
        """
        free_slots = self._allocator.available_size() - self.reserve_per_step * len(self.running)
        token_budget = self.max_prefill_tokens
        admitted: list[Request] = []
        while self.waiting and len(self.running) < self.max_running_requests:
            request = self.waiting[0]
            fill_len = request.num_tokens
            if admitted and fill_len > token_budget:
                break
            if fill_len + self.reserve_per_step > free_slots:
                freed = self._trim_windows()  # a waiting request before windows grown ahead
                if not freed:
                    break
                free_slots += freed
                continue
            rows = self._req_to_token_pool.alloc(1)
            if rows is None:
                break
            self.waiting.popleft()
            request.admit(rows[0], self._clock())
            self.running.append(request)
            admitted.append(request)
            free_slots -= fill_len + self.reserve_per_step
            token_budget -= fill_len
        self._slots.grow([(r, r.num_tokens) for r in admitted])
        self.stats.num_admitted += len(admitted)
        return admitted

    def shrink_window(self, request: Request, new_allocated_len: int) -> None:
        """Free the slots of ``req_to_token[row, new_allocated_len:allocated]`` now (v1 only)."""
        free_window_tail(request, new_allocated_len, self._allocator, self._req_to_token_pool)
