"""Domain: how one request samples and when it stops (``SamplingParams``), checked when built."""

from __future__ import annotations

from dataclasses import dataclass


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
