"""Domain: how one request samples and when it stops (``SamplingParams``, checked when built),
and the reference semantics of sampling: logits → probabilities (temperature, top-k, top-p) →
tokens. Coins are inputs, so every function here is deterministic given them and free of host
syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples and when it stops.

    ``temperature`` 0 is greedy (argmax); ``top_k`` None keeps every token; ``top_p`` None keeps
    the whole distribution; ``seed`` seeds the request's own coin generator, so its samples do
    not depend on which other requests share its batches (None: a fresh random seed).
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row sampling distribution → (rows, V) float32.

    ``temperature`` (rows,): 0 means greedy (a one-hot on the argmax). ``top_k`` (rows,) int:
    keep the k most likely tokens (0 or >= V keeps all). ``top_p`` (rows,) float: keep the
    smallest set of most likely tokens whose probability reaches p (>= 1 keeps all). A row that
    neither filter cuts is exactly its tempered softmax, whatever the other rows ask for.
    """
    return filtered_probs(tempered_probs(logits, temperature), top_k, top_p)


def tempered_probs(
    logits: torch.Tensor, temperature: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(rows, V) logits, (rows,) temperatures → (rows, V) float32: each row's softmax of
    logits / temperature, or a one-hot on its first maximum where the temperature is <= 0;
    written into ``out`` (rows, V) float32 where given (any row stride)."""
    # logits: (rows, V)
    logits = logits.float()
    greedy = temperature <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    probs = torch.softmax(logits / safe_t.unsqueeze(1), dim=1)
    one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)
    result = torch.where(greedy.unsqueeze(1), one_hot, probs)
    return result if out is None else out.copy_(result)


def filtered_probs(
    probs: torch.Tensor, top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None
) -> torch.Tensor:
    """``probs`` (rows, V) float32 cut to each row's top k, renormalised, then to the top-p
    nucleus of that (SGLang's order). A row neither filter cuts, a one-hot row among them, is
    returned bit for bit."""
    if top_k is None and top_p is None:
        return probs
    vocab = probs.shape[1]
    sorted_p, order = torch.sort(probs, dim=1, descending=True, stable=True)
    rank = torch.arange(vocab, device=probs.device).unsqueeze(0)
    if top_k is not None:
        k = torch.where(top_k <= 0, vocab, top_k).unsqueeze(1)
        sorted_p = _keep(sorted_p, rank < k)
    if top_p is not None:
        # top_p >= 1 keeps every token by definition: the float32 cumulative sum may reach
        # 1.0 before the tail, and a comparison against it would drop the tail's tokens
        mass_before = torch.cumsum(sorted_p, dim=1) - sorted_p
        p = top_p.unsqueeze(1).float()
        sorted_p = _keep(sorted_p, (p >= 1) | (mass_before < p) | (rank == 0))
    return torch.zeros_like(probs).scatter_(1, order, sorted_p)


def _keep(probs: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Zero the tokens outside ``kept`` and renormalise the rows that lost one; a row that keeps
    every token is returned bit for bit, so a request's distribution does not depend on whether
    its batch neighbours filter theirs."""
    # probs, kept: (rows, V)
    cut = torch.where(kept, probs, 0.0)
    lost_any = (~kept).any(dim=1, keepdim=True)
    return torch.where(lost_any, cut / cut.sum(dim=1, keepdim=True), probs)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """(rows, V) -> (rows,) int64: each row's first maximum (greedy decoding's choice)."""
    return logits.argmax(dim=-1)


def sample_from_probs(probs: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds coin·total.

    ``probs`` (rows, V) non-negative, not necessarily normalised; ``coins`` (rows,) in [0, 1).
    A zero-probability token is never returned (unless a row is all zero: then token 0).
    """
    cdf = torch.cumsum(probs.float(), dim=1)  # (rows, V)
    threshold = coins.float().unsqueeze(1) * cdf[:, -1:]
    index = torch.searchsorted(cdf, threshold, right=True).squeeze(1)
    # rounding can push the threshold past the last step of the CDF: clamp to a real token
    vocab = torch.arange(probs.shape[1], device=probs.device)
    last_nonzero = torch.where(probs > 0, vocab, 0).amax(dim=1) if probs.shape[1] else index
    return torch.minimum(index, last_nonzero)


def top_k_probs(
    logits: torch.Tensor, k: int, token_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens of each row and their softmax probabilities, best first.

    ``logits`` (rows, V); −inf entries (outside an EAGLE-3 draft vocabulary) have probability 0.
    Ties go to the lower column. ``token_ids`` (V,) int64 names each column's target token (a
    draft's reduced vocabulary, ``ModelOutput.token_ids``); None: column i is token i. Returns
    (probabilities (rows, k) float32, tokens (rows, k) int64).
    """
    probs = torch.softmax(logits.float(), dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k].contiguous()
    tokens = order if token_ids is None else token_ids[order]
    return torch.gather(probs, 1, order), tokens
