"""Per-request sampling of next tokens: each request's parameters and its own seeded coins."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.app.forward_batches import to_device
from eagletree.domain.sampling import probs_from_logits, sample_from_probs

if TYPE_CHECKING:
    from eagletree.domain.request import Request


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """The sampling parameters of a batch's requests as device tensors, one row per request."""

    temperature: torch.Tensor  # (bs,) float32; 0 = greedy
    top_k: torch.Tensor | None  # (bs,) int64, 0 = keep all; None when no request sets it
    top_p: torch.Tensor | None  # (bs,) float32, 1 = keep all; None when no request sets it
    all_greedy: bool

    @staticmethod
    def from_requests(requests: Sequence[Request], device: torch.device) -> SamplingBatch:
        params = [r.params for r in requests]
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        top_k = None
        if any(p.top_k is not None for p in params):
            top_k = torch.tensor([p.top_k or 0 for p in params], dtype=torch.int64)
        top_p = None
        if any(p.top_p is not None for p in params):
            values = [1.0 if p.top_p is None else p.top_p for p in params]
            top_p = torch.tensor(values, dtype=torch.float32)
        return SamplingBatch(
            temperature=to_device(temperature, device),
            top_k=None if top_k is None else to_device(top_k, device),
            top_p=None if top_p is None else to_device(top_p, device),
            all_greedy=all(p.greedy for p in params),
        )

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(bs, V) float32 sampling distributions (one-hot argmax rows for greedy requests)."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)


def draw_coins(requests: Sequence[Request], device: torch.device) -> torch.Tensor:
    """(bs,) one coin per request from its own generator; greedy requests draw none (0.0)."""
    coins = [r.draw_coins(1) if not r.params.greedy else torch.zeros(1) for r in requests]
    return to_device(torch.cat(coins) if coins else torch.zeros(0), device)


def sample_next_tokens(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """Next token of each request, (bs,) int64 on the logits' device; no host sync.

    ``logits``: (bs, V), row i belongs to ``requests[i]``. An all-greedy batch takes the argmax
    directly (the same token as the one-hot path: both pick the first maximum).
    """
    sampling = SamplingBatch.from_requests(requests, logits.device)
    if sampling.all_greedy:
        return logits.argmax(dim=-1)
    return sample_from_probs(sampling.probs(logits), draw_coins(requests, logits.device))
