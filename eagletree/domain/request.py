"""Domain: per-request state — tokens, lengths of the KV window, life cycle, finish, coins.

The request's ``SamplingParams`` are in domain/sampling.py, the ``AcceptanceStats`` of its
verify steps in domain/acceptance_stats.py.

Lengths (page_size 1), all host-side Python ints:

* ``committed_len`` — tokens whose KV is valid in the pools (``L``); the last sampled token is
  pending (its KV is written by the next forward), so a running request has
  ``committed_len <= num_tokens - 1`` once prefilled. (A prefill commits its fill when it is
  launched, so until its first token is read ``committed_len == num_tokens``; while a decode
  step is in flight, ``committed_len`` lags the device's by that step.)
* ``allocated_len`` — columns ``[0, allocated_len)`` of the request's req_to_token row hold KV
  slots owned by this request. ``[committed_len, allocated_len)`` is the window a step writes
  into (a decode token, or a draft tree and its verify nodes); a speculative worker keeps it
  ``>= committed + 2·max(S·k, N)`` so that the host may learn lengths one step late.

Life cycle: WAITING → (admit) RUNNING → (finish/abort) FINISHED, or RUNNING → (retract) WAITING
with every token kept: a retracted request is prefilled again over prompt + output.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from eagletree.domain.sampling import SamplingParams


class FinishReason(enum.Enum):
    EOS = "eos"  # an end-of-sequence token of the model (kept in the output)
    STOP = "stop"  # one of the request's stop token ids (kept in the output)
    LENGTH = "length"  # max_new_tokens, or the context length, reached
    ABORT = "abort"  # aborted by the caller


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class RequestTimes:
    """Wall-clock instants (``time.perf_counter`` seconds) of a request's life."""

    arrival: float
    first_admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None


class Request:
    """One generation request and the KV window it owns; every transition checks invariants."""

    __slots__ = (
        "_coin_seed",
        "allocated_len",
        "coin_offset",
        "committed_len",
        "emitted_per_step",
        "finish_reason",
        "max_total_len",
        "num_retractions",
        "output_ids",
        "params",
        "prompt_ids",
        "request_id",
        "row",
        "status",
        "times",
    )

    def __init__(
        self,
        request_id: int,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        max_context_len: int,
        arrival_time: float = 0.0,
    ) -> None:
        if not prompt_ids:
            raise ValueError(f"request {request_id}: the prompt is empty")
        if len(prompt_ids) >= max_context_len:
            raise ValueError(
                f"request {request_id}: the prompt has {len(prompt_ids)} tokens and the context "
                f"holds {max_context_len}, which leaves no room for output"
            )
        self.request_id = request_id
        self.prompt_ids: tuple[int, ...] = tuple(prompt_ids)
        self.params = params
        # prompt + output never exceeds this: the request finishes with LENGTH when it is reached
        self.max_total_len = min(len(prompt_ids) + params.max_new_tokens, max_context_len)
        self.output_ids: list[int] = []
        self.status = RequestStatus.WAITING
        self.row: int | None = None
        self.committed_len = 0
        self.allocated_len = 0
        self.finish_reason: FinishReason | None = None
        self.num_retractions = 0
        # tokens emitted per speculative verify step (empty without speculation)
        self.emitted_per_step: list[int] = []
        self.times = RequestTimes(arrival=arrival_time)
        self._coin_seed: int | None = None
        self.coin_offset = 0  # coins of the request's stream used so far
        self.check_invariants()

    # -- tokens --------------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def all_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def fill_ids(self) -> list[int]:
        """Tokens a (re)prefill computes: the whole sequence (there is no prefix cache)."""
        return self.all_ids

    @property
    def is_prefilled(self) -> bool:
        return self.status is RequestStatus.RUNNING and self.committed_len > 0

    @property
    def finishing(self) -> bool:
        """A finish reason is known but the request still holds its row and slots."""
        return self.finish_reason is not None and self.status is not RequestStatus.FINISHED

    # -- transitions ---------------------------------------------------------------------------

    def admit(self, row: int, now: float) -> None:
        """WAITING → RUNNING on req_to_token row ``row``, with an empty window."""
        assert self.status is RequestStatus.WAITING, self
        self.status = RequestStatus.RUNNING
        self.row = row
        if self.times.first_admitted is None:
            self.times.first_admitted = now
        self.check_invariants()

    def grow_window(self, new_allocated_len: int) -> None:
        """Record that slots now back the row up to ``new_allocated_len`` (never shrinks)."""
        assert self.status is RequestStatus.RUNNING, self
        assert new_allocated_len >= self.allocated_len, (new_allocated_len, self)
        # the hot transitions (every running request, every step) assert what they can break,
        # not every invariant: at a batch of 64 the full check cost the host 0.2 ms a step
        self.allocated_len = new_allocated_len

    def shrink_window(self, new_allocated_len: int) -> None:
        """Record that the row's slots past ``new_allocated_len`` went back to the allocator.

        Only the v1 worker shrinks a window (it frees rejected draft slots every step); the
        committed prefix is never given up this way.
        """
        assert self.status is RequestStatus.RUNNING, self
        assert self.committed_len <= new_allocated_len <= self.allocated_len, (
            new_allocated_len,
            self,
        )
        self.allocated_len = new_allocated_len
        self.check_invariants()

    def commit(self, num_tokens: int) -> None:
        """``num_tokens`` more tokens have their KV written in the pools."""
        assert num_tokens >= 0
        committed = self.committed_len = self.committed_len + num_tokens
        assert committed <= self.allocated_len and committed <= self.num_tokens, self

    def append_tokens(
        self, tokens: Sequence[int], eos_token_ids: Collection[int], now: float
    ) -> int:
        """Append generated tokens up to the first stop condition; returns how many were kept.

        The EOS or stop token that finishes a request is kept; tokens after it, or past
        ``max_total_len``, are dropped (a speculative step may emit several at once).
        """
        assert self.status is RequestStatus.RUNNING and self.finish_reason is None, self
        output = self.output_ids
        stops = self.params.stop_token_ids
        room = self.max_total_len - len(self.prompt_ids) - len(output)  # tokens before LENGTH
        kept = 0
        for token in tokens:  # per token of every request every step: locals, no properties
            output.append(token)
            kept += 1
            if token in stops:
                self.finish_reason = FinishReason.STOP
            elif token in eos_token_ids:
                self.finish_reason = FinishReason.EOS
            elif kept >= room:
                self.finish_reason = FinishReason.LENGTH
            else:
                continue
            break
        if kept and self.times.first_token is None:
            self.times.first_token = now
        return kept

    def mark_aborted(self) -> None:
        """Set the ABORT reason; the scheduler releases the request at its next step."""
        if self.status is not RequestStatus.FINISHED:
            self.finish_reason = FinishReason.ABORT

    def release(self) -> tuple[int, int]:
        """Give up the row and the window; returns (row, allocated_len) for the caller to free.

        The caller frees the slots ``req_to_token[row, :allocated_len]`` exactly once.
        """
        assert self.status is RequestStatus.RUNNING and self.row is not None, self
        row, allocated = self.row, self.allocated_len
        self.row = None
        self.committed_len = 0
        self.allocated_len = 0
        return row, allocated

    def retract(self) -> None:
        """RUNNING → WAITING keeping every token, once ``release`` gave the row up."""
        assert self.status is RequestStatus.RUNNING and self.row is None, self
        assert self.finish_reason is None, self
        self.status = RequestStatus.WAITING
        self.num_retractions += 1
        self.check_invariants()

    def finish(self, now: float) -> None:
        """→ FINISHED once a finish reason is set and the row (if any) was released."""
        assert self.finish_reason is not None and self.row is None, self
        self.status = RequestStatus.FINISHED
        self.times.finished = now
        self.check_invariants()

    # -- sampling coins --------------------------------------------------------------------------

    @property
    def coin_seed(self) -> int:
        """The key of the request's Philox coin stream (``domain.coins``), a signed 64-bit int.

        ``params.seed`` when given; else drawn once from the operating system's entropy.
        """
        if self._coin_seed is None:
            seed = self.params.seed
            if seed is None:
                seed = int.from_bytes(os.urandom(8), "little")
            # the low 64 bits as a signed int64 (what a device tensor holds)
            self._coin_seed = ((seed + (1 << 63)) % (1 << 64)) - (1 << 63)
        return self._coin_seed

    def take_coins(self, count: int) -> int:
        """Reserve the next ``count`` coins of the request's stream; returns their first offset.

        Coins are a pure function of (seed, offset), so a request's samples do not depend on its
        batch, its padding or on graph replay; one reservation per sampled step keeps a
        retracted request's recomputation from reusing or skipping coins.
        """
        if count < 0:
            raise ValueError(f"cannot take {count} coins")
        first = self.coin_offset
        self.coin_offset += count
        return first

    # -- invariants ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        assert 0 <= self.committed_len <= self.allocated_len, self
        assert self.committed_len <= self.num_tokens, self
        assert self.num_tokens <= self.max_total_len, self
        if self.status is RequestStatus.RUNNING:
            assert self.row is not None, self
        else:
            assert self.row is None and self.allocated_len == 0, self
        if self.status is RequestStatus.FINISHED:
            assert self.finish_reason is not None, self
        if self.status is RequestStatus.WAITING:
            assert self.finish_reason in (None, FinishReason.ABORT), self

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id}, {self.status.name}, row={self.row}, "
            f"tokens={len(self.prompt_ids)}+{len(self.output_ids)}, "
            f"committed={self.committed_len}, allocated={self.allocated_len}, "
            f"finish={self.finish_reason})"
        )
