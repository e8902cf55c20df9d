"""The request side of one decode step, in fixed device buffers that a CUDA graph can read.

A decode step needs little host data per request: its req_to_token row, its committed length,
its pending token and its sampling parameters (plus, for some workers, a few more ints). They
are written into one pinned host block and copied with one non-blocking copy into device
buffers whose addresses never change, so a graph captured over views of them reads each step's
values. Rows past the batch (padding up to a graph's batch size) point at a *padding row* of the
req_to_token table whose slots are all 0, the pools' reserved dummy slot: a padded row reads and
writes only slot 0 and the padding row's draft state, never a live request's memory.

With ``device_lengths`` the buffers also keep every row's committed length on the device
(``committed``): a prefill sets it (``set_lengths``), the decode step advances it
(``advance_lengths``), and the step gathers its ``seq_lens`` from it (``gather_device_state``:
``fill`` does, or a step runner inside its graph), so a step can be launched before the host
has read the previous step's accept lengths (the engine's overlap mode). The host's
``committed_len`` is then only a lower bound, and a step without exact host lengths carries no
``seq_lens_cpu``.

With ``device_tokens`` they keep every row's pending token on the device (``pending_tokens``):
a prefill and each decode step write the token they sampled (``set_pending_tokens``) and the
step gathers its ``last_tokens`` from it, so a step can be launched before the host has read
the tokens of the previous one. (The plain worker's lengths need no device table: each
of its decode steps commits exactly one token, so the host passes exact ``lengths`` to ``fill``.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.transfers import to_device
from eagletree.app.workers.sampler import (
    SamplingInputs,
    SamplingMode,
    sampling_mode,
    sampling_rows,
)

if TYPE_CHECKING:
    from eagletree.domain.request import Request
    from eagletree.ports.memory import ReqToTokenPool

# int64 fields, in the order of the rows of the buffer block
_INT_FIELDS = ("rows", "seq_lens", "last_tokens", "top_k", "seeds", "coin_offsets")
_FLOAT_FIELDS = ("temperature", "top_p")


@dataclass(frozen=True, slots=True)
class DecodeInputs:
    """Device views of one step's request data, ``padded_size`` rows (live rows first)."""

    rows: torch.Tensor  # (padded,) int64 req_to_token rows (padding: the padding row)
    seq_lens: torch.Tensor  # (padded,) int64 committed lengths L_b (padding: 0)
    last_tokens: torch.Tensor  # (padded,) int64 each request's pending token (padding: 0)
    sampling: SamplingInputs  # padding rows are greedy
    batch_size: int  # live rows
    # (padded,) int64 host copy of seq_lens for eager steps; None in a captured graph, whose
    # launches must not depend on the values of one step, and when the host does not know them
    seq_lens_cpu: torch.Tensor | None = None
    seq_lens_sum: int | None = None  # Σ seq_lens_cpu, known with it

    @property
    def padded_size(self) -> int:
        return int(self.rows.shape[0])


class DecodeInputBuffers:
    """Device buffers for up to ``capacity`` rows; ``fill`` writes a step into them.

    ``padding_row`` is a req_to_token row no request owns, with every slot 0, where ``padded``
    (else steps are never padded, and ``padding_row`` may be a request's).
    Two pinned staging blocks alternate, so a step's copy never reads a block the host is
    rewriting for the next step.
    """

    def __init__(
        self,
        capacity: int,
        device: torch.device,
        padding_row: int,
        *,
        device_lengths: bool = False,
        device_tokens: bool = False,
        padded: bool = True,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"decode input capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.padding_row = padding_row
        self.padded = padded
        self.device = device
        self._rows_total = len(_INT_FIELDS)
        # ints: (fields, capacity) int64; floats: (2, capacity) float32
        self._ints = torch.zeros(self._rows_total, capacity, dtype=torch.int64, device=device)
        self._floats = torch.zeros(len(_FLOAT_FIELDS), capacity, dtype=torch.float32, device=device)
        pin = device.type == "cuda"
        self._staging = [
            (
                torch.zeros(self._rows_total, capacity, dtype=torch.int64, pin_memory=pin),
                torch.zeros(len(_FLOAT_FIELDS), capacity, dtype=torch.float32, pin_memory=pin),
            )
            for _ in range(2)
        ]
        self._turn = 0
        self._views: dict[tuple[int, SamplingMode], DecodeInputs] = {}  # the views never move
        # (capacity,) int64 committed length of every req_to_token row (device_lengths only)
        self.committed: torch.Tensor | None = (
            torch.zeros(capacity, dtype=torch.int64, device=device) if device_lengths else None
        )
        # (capacity,) int64 pending token of every req_to_token row (device_tokens only)
        self.pending_tokens: torch.Tensor | None = (
            torch.zeros(capacity, dtype=torch.int64, device=device) if device_tokens else None
        )

    @staticmethod
    def for_pool(
        pool: ReqToTokenPool,
        *,
        padded: bool,
        device_lengths: bool = False,
        device_tokens: bool = False,
    ) -> DecodeInputBuffers:
        """Buffers for every row of ``pool`` on its device. With ``padded`` one row is taken
        from the pool for good and zeroed to be the padding row (every slot is slot 0)."""
        padding_row = 0
        if padded:
            rows = pool.alloc(1)
            if rows is None:
                raise ValueError("the req_to_token pool has no free row for padding batches")
            padding_row = rows[0]
            pool.req_to_token[padding_row].zero_()
        device = pool.req_to_token.device
        return DecodeInputBuffers(
            pool.size,
            device,
            padding_row,
            device_lengths=device_lengths,
            device_tokens=device_tokens,
            padded=padded,
        )

    def set_lengths(self, requests: Sequence[Request]) -> None:
        """Record the committed lengths the host knows exactly (after a prefill: every token
        of the fill); a host → device copy, the device never waits for the host."""
        assert self.committed is not None, "the buffers keep no device lengths"
        if not requests:
            return
        rows = torch.tensor([r.row for r in requests], dtype=torch.int64)
        lens = torch.tensor([r.num_tokens for r in requests], dtype=torch.int64)
        self.committed[to_device(rows, self.device)] = to_device(lens, self.device)

    def advance_lengths(self, rows: torch.Tensor, new_lens: torch.Tensor) -> None:
        """Store ``new_lens`` (padded,) as the committed lengths of ``rows`` (padded,); device
        ops only (padding rows all write the padding row, whose length is never gathered)."""
        assert self.committed is not None, "the buffers keep no device lengths"
        self.committed[rows] = new_lens

    def set_pending_tokens(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Store ``tokens`` (n,) int64 as the pending tokens of ``rows`` (n,) int64; one device
        scatter (padding rows all write the padding row, whose token is never gathered)."""
        assert self.pending_tokens is not None, "the buffers keep no device tokens"
        self.pending_tokens[rows] = tokens

    def fill(
        self,
        requests: Sequence[Request],
        padded_size: int,
        num_coins: int,
        *,
        exact_lengths: bool = True,
        lengths: Sequence[int] | None = None,
        gather: bool = True,
        mode: SamplingMode | None = None,
    ) -> DecodeInputs:
        """Write ``requests`` (then padding up to ``padded_size``) and return device views.

        Reserves ``num_coins`` coins of every sampling request. With device lengths ``seq_lens``
        is gathered from ``committed``; ``exact_lengths`` False: the host's lengths are stale,
        so the views carry no ``seq_lens_cpu``. ``lengths``: the requests' committed lengths
        where the caller knows them better than their ``committed_len``. With device tokens
        ``last_tokens`` is gathered from ``pending_tokens``. ``gather`` False leaves both
        gathers to the caller's step (``gather_device_state``). ``mode``: the requests'
        ``sampling_mode``, where the caller computed it already.
        """
        bs = len(requests)
        if not bs <= padded_size <= self.capacity:
            raise ValueError(f"{bs} requests padded to {padded_size} > capacity {self.capacity}")
        if padded_size > bs and not self.padded:
            raise ValueError(f"{bs} requests padded to {padded_size}: no padding row here")
        ints, floats = self._staging[self._turn]
        self._turn ^= 1
        # one host tensor per block, built from Python lists: a handful of torch calls per step
        # whatever the batch (each call costs microseconds of host time on the hot path)
        pad = padded_size - bs
        zeros = [0] * pad
        mode = sampling_mode(requests) if mode is None else mode
        sampling_ints, sampling_floats = sampling_rows(requests, num_coins, mode)
        known = [r.committed_len for r in requests] if lengths is None else list(lengths)
        if len(known) != bs:
            raise ValueError(f"{len(known)} lengths for {bs} requests")
        lens = known + zeros
        int_rows = [
            [r.row for r in requests] + [self.padding_row] * pad,
            lens,
            [r.last_token for r in requests] + zeros,
            *(sampling_ints[i * bs : (i + 1) * bs] + zeros for i in range(3)),
        ]
        float_rows = [
            sampling_floats[:bs] + [0.0] * pad,  # temperature: padding rows are greedy
            sampling_floats[bs:] + [1.0] * pad,  # top_p: padding rows keep all
        ]
        ints[:, :padded_size].copy_(torch.tensor(int_rows, dtype=torch.int64))
        floats[:, :padded_size].copy_(torch.tensor(float_rows, dtype=torch.float32))
        # whole blocks (a few KiB): contiguous copies, so they stay asynchronous from pinned memory
        non_blocking = self.device.type == "cuda"
        self._ints.copy_(ints, non_blocking=non_blocking)
        self._floats.copy_(floats, non_blocking=non_blocking)
        views = self.views(padded_size, bs, mode=mode)
        if gather and bs:
            self.gather_device_state(views)
        if not exact_lengths:
            return views
        seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
        return dataclasses.replace(views, seq_lens_cpu=seq_lens_cpu, seq_lens_sum=sum(lens))

    def gather_device_state(self, inputs: DecodeInputs) -> None:
        """Overwrite the host's lengths and tokens of ``inputs``' live rows (stale while a step
        is in flight) with the device's ``committed`` and ``pending_tokens`` where it keeps
        them; padding rows keep their 0s. Device ops only, whatever the rows: a step runner
        runs them inside its captured graph, where they cost the host no launch."""
        if self.committed is None and self.pending_tokens is None:
            return
        rows = inputs.rows
        if not self.padded:  # every row is a request's
            if self.committed is not None:
                torch.index_select(self.committed, 0, rows, out=inputs.seq_lens)
            if self.pending_tokens is not None:
                torch.index_select(self.pending_tokens, 0, rows, out=inputs.last_tokens)
            return
        live = rows != self.padding_row  # (padded,) bool
        if self.committed is not None:
            torch.where(live, self.committed[rows], inputs.seq_lens, out=inputs.seq_lens)
        if self.pending_tokens is not None:
            torch.where(live, self.pending_tokens[rows], inputs.last_tokens, out=inputs.last_tokens)

    def views(
        self,
        padded_size: int,
        batch_size: int,
        *,
        mode: SamplingMode,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> DecodeInputs:
        """The device views of the first ``padded_size`` rows (what ``fill`` last wrote)."""
        key = (padded_size, mode)
        cached = self._views.get(key)
        if cached is None:
            cached = self._make_views(padded_size, mode)
            self._views[key] = cached
        if seq_lens_cpu is None and cached.batch_size == batch_size:
            return cached
        views = dataclasses.replace(cached, batch_size=batch_size, seq_lens_cpu=seq_lens_cpu)
        if seq_lens_cpu is None:
            # kept for the next step of this batch size: a capture's views of no rows would
            # otherwise be replaced at every step
            self._views[key] = views
        return views

    def _make_views(self, padded_size: int, mode: SamplingMode) -> DecodeInputs:
        ints, floats = self._ints[:, :padded_size], self._floats[:, :padded_size]
        return DecodeInputs(
            rows=ints[0],
            seq_lens=ints[1],
            last_tokens=ints[2],
            sampling=SamplingInputs(
                temperature=floats[0],
                top_k=ints[3],
                top_p=floats[1],
                seeds=ints[4],
                coin_offsets=ints[5],
                mode=mode,
            ),
            batch_size=padded_size,
        )
