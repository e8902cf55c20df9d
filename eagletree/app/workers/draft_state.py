"""Per-request device state between speculative steps: the bonus token, the draft's top-k after
it and the draft hidden state that proposed them (``DraftInput``), kept in device tensors indexed
by req_to_token row (``DraftStateStore``), so that a step reads and writes it without the host
ever seeing its values; and the target outputs a row's draft has not read yet (``DraftLag``).

Why a lag: a plain step (no drafts) needs only the target, but the draft must still see every
committed token before it drafts again. Running the draft over each token at once costs a draft
forward per plain step; leaving the (token, target feature) pairs in a per-row buffer and
extending the draft over up to ``width`` of them in one forward (a catch-up) costs one every
``width`` steps, as wide a forward as a verify's re-extend."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.domain.draft_shape import draft_lag_width
from eagletree.domain.tree import TreeMaskMode

if TYPE_CHECKING:
    from eagletree.domain.draft_shape import DraftShape
    from eagletree.domain.request import Request


@dataclass(frozen=True, slots=True)
class DraftInput:
    """Per request: the state a draft phase starts from (one row per request)."""

    bonus_tokens: torch.Tensor  # (bs,) int64 pending token: the root of the next tree
    topk_p: torch.Tensor  # (bs, k) float32 draft probabilities of the root's children
    topk_index: torch.Tensor  # (bs, k) int64 their tokens
    hidden_states: torch.Tensor  # (bs, H_draft) draft hidden state that proposed them
    # (bs, V_draft) the draft's logits after the bonus token, which the children were chosen
    # from: what a step that draws its drafts draws the root's children from (None: not kept)
    logits: torch.Tensor | None = None


class DraftStateStore:
    """``DraftInput`` of every live request in device tensors indexed by req_to_token row.

    ``gather`` and ``scatter`` are device ops over rows. The host remembers only which request
    owns each row (``own``), so a stale row (a request retracted, aborted or finished since it
    was written) is never read: ``retain`` drops every row whose owner is not in the step's
    plan, and ``check_owned`` refuses requests whose rows it does not hold. Of the lags it
    keeps one bound for all rows (``lag_bound``, ``ran``): a plain step's host work stays the
    same whatever the batch, and a bound too high only brings a catch-up forward.
    """

    def __init__(
        self,
        num_rows: int,
        topk: int,
        hidden_size: int,
        hidden_dtype: torch.dtype,
        device: torch.device,
        lag_width: int = 1,
        logits_width: int = 0,
    ) -> None:
        self._owner: dict[int, int] = {}  # row -> request id
        # the requests of the last step whose rows they all owned already (None: not so)
        self._retained: list[Request] | None = None
        # plain steps whose tokens some owned row's draft may not have read: at least any
        # row's lag (a row prefilled since lags less)
        self._lag_bound = 0
        self._owned_this_step = 0  # rows the current step's prefill gave an owner
        self.lag = DraftLag(num_rows, lag_width, device)
        self.bonus_tokens = torch.zeros(num_rows, dtype=torch.int64, device=device)
        self.topk_p = torch.zeros(num_rows, topk, dtype=torch.float32, device=device)
        self.topk_index = torch.zeros(num_rows, topk, dtype=torch.int64, device=device)
        self.hidden_states = torch.zeros(num_rows, hidden_size, dtype=hidden_dtype, device=device)
        # the root's logits of every row, where some step draws its drafts (``logits_width``:
        # the draft's columns; 0 keeps none)
        self.logits = (
            torch.zeros(num_rows, logits_width, dtype=hidden_dtype, device=device)
            if logits_width
            else None
        )

    def __len__(self) -> int:
        return len(self._owner)

    def retain(self, live: Sequence[Request]) -> bool:
        """A step begins: forget every row not owned by one of ``live`` (the requests of its
        plan). Returns whether they are the rows' owners already, every one (then no request
        of the plan needs ``check_owned``)."""
        self._owned_this_step = 0
        last = self._retained
        if last is not None and len(live) == len(last) and all(map(operator.is_, live, last)):
            return True  # the very requests found owners at the last step: one pass, no lookups
        owner = self._owner
        if len(live) == len(owner) and all(
            r.row is not None and owner.get(r.row) == r.request_id for r in live
        ):
            self._retained = list(live)
            return True  # the same requests as the step before: nothing to forget
        self._retained = None
        keep = {r.row: r.request_id for r in live if r.row is not None}
        self._owner = {row: rid for row, rid in owner.items() if keep.get(row) == rid}
        if not self._owner:
            self._lag_bound = 0
        return False

    def check_owned(self, requests: Sequence[Request]) -> None:
        """Raise unless the store holds a state written for each of ``requests`` (host only)."""
        for request in requests:
            if request.row is None or self._owner.get(request.row) != request.request_id:
                raise RuntimeError(f"no draft state for {request}: it was never prefilled")

    def own(self, requests: Sequence[Request]) -> None:
        """Record that the rows of ``requests``, just prefilled, now hold their states, their
        lags empty (host only)."""
        for request in requests:
            assert request.row is not None, request
            self._owner[request.row] = request.request_id
        self._owned_this_step += len(requests)

    def ran(self, decode: Sequence[Request], *, lagging: bool) -> None:
        """A decode step over ``decode`` (owned rows) ran. ``lagging``: it left one more token
        in each row's lag; else its draft read each row's whole lag, and when it left out no
        owned row but the ones prefilled in the same step, no row lags (host only)."""
        if not decode:
            return
        if lagging:
            self._lag_bound += 1
        elif len(decode) + self._owned_this_step == len(self._owner):
            self._lag_bound = 0

    @property
    def lag_bound(self) -> int:
        """The most tokens any owned row may have in its lag (host only: the host counts the
        steps that left them, so it never reads the device's counts)."""
        return self._lag_bound

    def gather(
        self, rows: torch.Tensor, topk: int | None = None, *, logits: bool = False
    ) -> DraftInput:
        """The states at ``rows`` (bs,) int64 device, with the first ``topk`` (default: all)
        of each top-k, the likeliest, and with ``logits`` the root's logits (kept only where a
        step draws its drafts); device ops only."""
        k = self.topk_p.shape[1] if topk is None else topk
        return DraftInput(
            bonus_tokens=self.bonus_tokens[rows],
            topk_p=self.topk_p[rows, :k],
            topk_index=self.topk_index[rows, :k],
            hidden_states=self.hidden_states[rows],
            logits=self.logits[rows] if logits and self.logits is not None else None,
        )

    def scatter(self, rows: torch.Tensor, state: DraftInput) -> None:
        """Write row i of ``state`` at ``rows[i]``; device ops only (padding rows repeat one row:
        whichever write lands is never read)."""
        self.bonus_tokens[rows] = state.bonus_tokens.to(torch.int64)
        self.topk_p[rows] = state.topk_p.float()
        self.topk_index[rows] = state.topk_index.to(torch.int64)
        self.hidden_states[rows] = state.hidden_states.to(self.hidden_states.dtype)
        if self.logits is not None:
            assert state.logits is not None, "a state without the logits drawn drafts need"
            self.logits[rows] = state.logits.to(self.logits.dtype)


class DraftLag:
    """Per req_to_token row, up to ``width`` (token, target feature) pairs that the draft has not
    extended over yet, in the draft convention: pair i is the token at position p + 1 with the
    target's feature at p. ``count`` is each row's number of pairs (device). A plain step
    appends its pairs with its other per-row writes (``domain.draft_lag``)."""

    def __init__(self, num_rows: int, width: int, device: torch.device) -> None:
        if width < 1:
            raise ValueError(f"a draft lag holds at least one token per row, got width {width}")
        self.width = width
        self.tokens = torch.zeros(num_rows, width, dtype=torch.int64, device=device)
        self.count = torch.zeros(num_rows, dtype=torch.int64, device=device)
        # (num_rows, width, F): F (the target's hidden or aux width) and dtype are known at the
        # first plain step (``features_for``)
        self.features: torch.Tensor | None = None

    def features_for(self, features: torch.Tensor) -> torch.Tensor:
        """The pairs' features (num_rows, width, F), made at the first call from ``features``
        (bs, F): their width and dtype (a graph capture's eager warm-up always calls first)."""
        if self.features is None:
            shape = (*self.tokens.shape, features.shape[-1])
            self.features = torch.zeros(shape, dtype=features.dtype, device=features.device)
        return self.features

    def read(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pairs of ``rows`` (bs,) as extend-block inputs: tokens (bs·width,) int64,
        features (bs·width, F) and counts (bs,) int64 (rows past a count are stale)."""
        assert self.features is not None, "a catch-up before any plain step recorded a pair"
        return (
            self.tokens[rows].reshape(-1),
            self.features[rows].reshape(-1, self.features.shape[-1]),
            self.count[rows],
        )

    def clear(self, rows: torch.Tensor) -> None:
        """The draft has read every pair of ``rows`` (a catch-up, or a prefill's new state)."""
        self.count.index_fill_(0, rows, 0)  # a fill, not a host scalar copied in a graph


def lag_width(shapes: Sequence[DraftShape], mask_mode: TreeMaskMode) -> int:
    """How many plain steps' tokens a row's draft may leave unread (``draft_lag_width``; the
    scheduler keeps the slots a catch-up's block writes backed); 1 — a catch-up every plain
    step — where the tree mask is sized from the host's lengths (``FULL_MASK``), which a
    catch-up starting behind them does not have."""
    if mask_mode is not TreeMaskMode.QLEN_ONLY:
        return 1
    return draft_lag_width(shapes)
