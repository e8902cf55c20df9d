"""Domain: the rank profile of a draft head, learned from committed verify steps.

After a verify step, each request's accepted path says, depth by depth, which of the draft's
candidates the target took (its *rank*: 0 = the draft's most likely token) and how many
candidates the tree offered there. A depth the path reached is an *exposure* of every rank the
tree offered at it; the rank taken, if any, is a *hit*. ``hits / exposures`` per (depth, rank)
estimates ``RankProfile.hit_rates`` without bias from the tree's width: a rank the tree did not
offer is not counted against it. Counts decay geometrically (``half_life`` steps), so the
profile follows the text being generated; a prior (e.g. the head's training report) stands in
for ``prior_weight`` exposures until real ones outweigh it.
"""

from __future__ import annotations

from collections.abc import Sequence

from eagletree.domain.draft_shape import RankProfile


class AcceptanceProfile:
    """Decayed per-(depth, rank) hit and exposure counts → a ``RankProfile``."""

    def __init__(
        self,
        max_depth: int,
        max_rank: int,
        prior: RankProfile,
        *,
        prior_weight: float = 8.0,
        half_life: float = 64.0,
    ) -> None:
        if max_depth < 1 or max_rank < 1 or prior_weight < 0 or half_life <= 0:
            raise ValueError("max_depth, max_rank and half_life must be positive")
        self.max_depth = max_depth
        self.max_rank = max_rank
        self._decay = 0.5 ** (1.0 / half_life)
        self._hits = [
            [prior_weight * prior.rate(d, j) for j in range(max_rank)] for d in range(max_depth)
        ]
        self._exposures = [[prior_weight] * max_rank for _ in range(max_depth)]
        # what a count recorded now weighs: the counts decay by new ones weighing ever more (one
        # multiplication per step instead of one per count; only ratios are read)
        self._weight = 1.0

    def record(self, paths: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        """One verify step: per request ``(ranks, offered)``, ``ranks[d]`` the rank accepted
        at depth d + 1 (−1: none, the path ended there or before), ``offered[d]`` the
        candidates the tree offered at that depth under the accepted path (0 where the path did
        not reach it). The counts so far decay by one step first."""
        self._weight /= self._decay
        if self._weight > _RESCALE_ABOVE:
            self._rescale()
        for ranks, offered in paths:
            self._record_path(ranks, offered)

    def _record_path(self, ranks: Sequence[int], offered: Sequence[int]) -> None:
        weight = self._weight
        for depth, (rank, count) in enumerate(zip(ranks, offered, strict=True)):
            if depth >= self.max_depth or count <= 0:
                break
            exposures = self._exposures[depth]
            for j in range(min(count, self.max_rank)):
                exposures[j] += weight
            if rank < 0:
                break
            if rank < self.max_rank:
                self._hits[depth][rank] += weight

    def exposures(self, depth: int, rank: int) -> float:
        """The decayed exposures of ``rank`` at ``depth`` (0-based), in steps' worth now."""
        return self._exposures[depth][rank] / self._weight

    def top_rates(self) -> list[float]:
        """Per depth, the rate of rank 0 (hits / exposures): a cheap sign of how far the
        profile has moved."""
        pairs = zip(self._hits, self._exposures, strict=True)
        return [hits[0] / exposures[0] if exposures[0] > 0 else 0.0 for hits, exposures in pairs]

    def profile(self) -> RankProfile:
        """The current estimate: per depth, each rank's hits / exposures, capped by the rate of
        the rank before it and by what the ranks before it leave of 1.

        Rank 0 is offered wherever a path reaches a depth, so its rate is the plain mean. A
        lower rank is offered only where the tree kept it, and EAGLE keeps it where the draft
        was unsure, which is where the target takes it most: its hits / exposures overstate
        its rate, and a row of them can sum past 1. Scaling such a row down would take rank 0
        with it (a greedy head whose chains accept 0.93 a depth priced at 0.74); the caps take
        the excess from the ranks that carry it, and keep a row non-increasing as the draft's
        ranking is."""
        rows = []
        for hits, exposures in zip(self._hits, self._exposures, strict=True):
            row: list[float] = []
            left = cap = 1.0
            for h, e in zip(hits, exposures, strict=True):
                rate = min(h / e if e > 0 else 0.0, cap, left)
                row.append(rate)
                left, cap = left - rate, rate
            rows.append(tuple(row))
        return RankProfile(tuple(rows))

    def _rescale(self) -> None:
        """Divide every count and the weight by the weight (before it could overflow)."""
        scale = 1.0 / self._weight
        for counts in (*self._hits, *self._exposures):
            for j in range(self.max_rank):
                counts[j] *= scale
        self._weight = 1.0


_RESCALE_ABOVE = 1e12
