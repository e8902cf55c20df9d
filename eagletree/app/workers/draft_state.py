"""Per-request device state between speculative steps: the bonus token, the draft's top-k after
it and the draft hidden state that proposed them (``DraftInput``), kept in device tensors indexed
by req_to_token row (``DraftStateStore``), so that a step reads and writes it without the host
ever seeing its values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from eagletree.domain.request import Request


@dataclass(frozen=True, slots=True)
class DraftInput:
    """Per request: the state a draft phase starts from (one row per request)."""

    bonus_tokens: torch.Tensor  # (bs,) int64 pending token: the root of the next tree
    topk_p: torch.Tensor  # (bs, k) float32 draft probabilities of the root's children
    topk_index: torch.Tensor  # (bs, k) int64 their tokens
    hidden_states: torch.Tensor  # (bs, H_draft) draft hidden state that proposed them


class DraftStateStore:
    """``DraftInput`` of every live request in device tensors indexed by req_to_token row.

    ``gather`` and ``scatter`` are device ops over rows. The host remembers only which request
    owns each row (``own``), so a stale row (a request retracted, aborted or finished since it
    was written) is never read: ``retain`` drops every row whose owner is not in the step's
    plan, and ``check_owned`` refuses requests whose rows it does not hold.
    """

    def __init__(
        self,
        num_rows: int,
        topk: int,
        hidden_size: int,
        hidden_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
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

    def gather(self, rows: torch.Tensor, topk: int | None = None) -> DraftInput:
        """The states at ``rows`` (bs,) int64 device, with the first ``topk`` (default: all)
        of each top-k, the likeliest; device ops only."""
        k = self.topk_p.shape[1] if topk is None else topk
        return DraftInput(
            bonus_tokens=self.bonus_tokens[rows],
            topk_p=self.topk_p[rows, :k],
            topk_index=self.topk_index[rows, :k],
            hidden_states=self.hidden_states[rows],
        )

    def scatter(self, rows: torch.Tensor, state: DraftInput) -> None:
        """Write row i of ``state`` at ``rows[i]``; device ops only (padding rows repeat one row:
        whichever write lands is never read)."""
        self.bonus_tokens[rows] = state.bonus_tokens.to(torch.int64)
        self.topk_p[rows] = state.topk_p.float()
        self.topk_index[rows] = state.topk_index.to(torch.int64)
        self.hidden_states[rows] = state.hidden_states.to(self.hidden_states.dtype)
