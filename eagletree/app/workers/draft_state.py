"""What a speculative worker carries between steps: each request's window and draft state.

``DecodeWindow`` is the request side of one decode step (rows, committed lengths) and the slot
arithmetic of the window past the committed length. ``DraftInput`` is what the draft needs to
start drafting from a request: the pending bonus token (the next tree's root), the draft's
top-k proposals for the token after it, and the draft hidden state that produced them.
``DraftStateStore`` keeps ``DraftInput`` on the device in tensors indexed by req_to_token row,
so that a step reads and writes it without the host ever seeing its values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from eagletree.app.engine.host_copy import to_device
from eagletree.domain.request import Request


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """The running requests of one decode step, as the scheduler left them.

    ``seq_lens`` are committed lengths L_b; the request owns ``req_to_token[row, L_b:]`` up to
    its allocated length (at least the worker's ``reserve_per_step`` past L_b).
    """

    req_pool_indices: torch.Tensor  # (bs,) int64 device
    seq_lens: torch.Tensor  # (bs,) int64 device
    seq_lens_cpu: torch.Tensor | None = None  # (bs,) int64 host copy; None on a GPU-only step
    seq_lens_sum: int | None = None

    @staticmethod
    def of(requests: Sequence[Request], device: torch.device) -> DecodeWindow:
        rows = torch.tensor([r.row for r in requests], dtype=torch.int64)
        lens = torch.tensor([r.committed_len for r in requests], dtype=torch.int64)
        return DecodeWindow(
            req_pool_indices=to_device(rows, device),
            seq_lens=to_device(lens, device),
            seq_lens_cpu=lens,
            seq_lens_sum=int(lens.sum()),
        )

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    def slots(self, req_to_token: torch.Tensor, width: int) -> torch.Tensor:
        """``req_to_token[row_b, L_b : L_b + width]`` of every request → (bs, width) int64."""
        columns = self.seq_lens.unsqueeze(1) + torch.arange(width, device=self.seq_lens.device)
        return req_to_token[self.req_pool_indices.unsqueeze(1), columns].to(torch.int64)


@dataclass(frozen=True, slots=True)
class DraftInput:
    """Per request: the state a draft phase starts from (one row per request)."""

    bonus_tokens: torch.Tensor  # (bs,) int64 pending token: the root of the next tree
    topk_p: torch.Tensor  # (bs, k) float32 draft probabilities of the root's children
    topk_index: torch.Tensor  # (bs, k) int64 their tokens
    hidden_states: torch.Tensor  # (bs, H_draft) draft hidden state that proposed them


class DraftStateStore:
    """``DraftInput`` of every live request in device tensors indexed by req_to_token row.

    The host remembers only which request owns each row, so a stale row (a request retracted,
    aborted or finished since it was written) is never read: ``retain`` drops every row whose
    owner is not in the step's plan, and ``gather`` refuses rows it does not hold.
    """

    def __init__(
        self,
        num_rows: int,
        topk: int,
        hidden_size: int,
        hidden_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self._device = device
        self._owner: dict[int, int] = {}  # row -> request id
        self.bonus_tokens = torch.zeros(num_rows, dtype=torch.int64, device=device)
        self.topk_p = torch.zeros(num_rows, topk, dtype=torch.float32, device=device)
        self.topk_index = torch.zeros(num_rows, topk, dtype=torch.int64, device=device)
        self.hidden_states = torch.zeros(num_rows, hidden_size, dtype=hidden_dtype, device=device)

    def __len__(self) -> int:
        return len(self._owner)

    def retain(self, live: Sequence[Request]) -> None:
        """Forget every row not owned by one of ``live`` (the requests of the current plan)."""
        keep = {r.row: r.request_id for r in live if r.row is not None}
        self._owner = {row: rid for row, rid in self._owner.items() if keep.get(row) == rid}

    def gather(self, requests: Sequence[Request]) -> DraftInput:
        """The state of ``requests`` (each must have been written since it got its row)."""
        self.check_owned(requests)
        return self.gather_rows(self._rows(requests))

    def scatter(self, requests: Sequence[Request], state: DraftInput) -> None:
        """Store row i of ``state`` as the state of ``requests[i]``."""
        self.scatter_rows(self._rows(requests), state)
        self.own(requests)

    def check_owned(self, requests: Sequence[Request]) -> None:
        """Raise unless the store holds a state written for each of ``requests`` (host only)."""
        for request in requests:
            if request.row is None or self._owner.get(request.row) != request.request_id:
                raise RuntimeError(f"no draft state for {request}: it was never prefilled")

    def own(self, requests: Sequence[Request]) -> None:
        """Record that the rows of ``requests`` now hold their states (host only)."""
        for request in requests:
            assert request.row is not None, request
            self._owner[request.row] = request.request_id

    def gather_rows(self, rows: torch.Tensor) -> DraftInput:
        """The states at ``rows`` (bs,) int64 device; device ops only."""
        return DraftInput(
            bonus_tokens=self.bonus_tokens[rows],
            topk_p=self.topk_p[rows],
            topk_index=self.topk_index[rows],
            hidden_states=self.hidden_states[rows],
        )

    def scatter_rows(self, rows: torch.Tensor, state: DraftInput) -> None:
        """Write row i of ``state`` at ``rows[i]``; device ops only (padding rows repeat one row:
        whichever write lands is never read)."""
        self.bonus_tokens[rows] = state.bonus_tokens.to(torch.int64)
        self.topk_p[rows] = state.topk_p.float()
        self.topk_index[rows] = state.topk_index.to(torch.int64)
        self.hidden_states[rows] = state.hidden_states.to(self.hidden_states.dtype)

    def _rows(self, requests: Sequence[Request]) -> torch.Tensor:
        rows = torch.tensor([r.row for r in requests], dtype=torch.int64)
        return to_device(rows, self._device)
