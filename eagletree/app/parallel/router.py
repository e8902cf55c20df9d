"""App: which data-parallel rank takes each new request (the least loaded, ties by rank)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagletree.app.engine.scheduler import Scheduler


def route_by_load(prompt_lengths: Sequence[int], loads: Sequence[int]) -> list[int]:
    """The rank of each new request, in order: the rank with the least load, the lowest rank
    of those tied; a request adds its prompt's tokens to its rank's load before the next one
    is placed.

    ``loads``: each rank's tokens now (running and waiting requests, prompt and output), the
    group's size being ``len(loads)``. Deterministic, so every rank that knows the loads
    computes the same placement.
    """
    if not loads:
        raise ValueError("route_by_load needs at least one rank's load")
    current = list(loads)
    ranks: list[int] = []
    for length in prompt_lengths:
        rank = min(range(len(current)), key=lambda r: (current[r], r))
        current[rank] += length
        ranks.append(rank)
    return ranks


def load_of(scheduler: Scheduler) -> int:
    """A replica's load as the router measures it: the tokens (prompt and output) of its
    running and waiting requests."""
    return sum(request.num_tokens for request in [*scheduler.running, *scheduler.waiting])
