"""Domain: the rank profile of a draft head, learned from committed verify steps.

After a verify step, each request's accepted path says, depth by depth, which of the draft's
candidates the target took (its *rank*: 0 = the draft's most likely token) and how many
candidates the tree offered there. A depth the path reached is an *exposure* of every rank the
tree offered at it; the rank taken, if any, is a *hit*. ``hits / exposures`` per (depth, rank)
estimates ``RankProfile.hit_rates`` without bias from the tree's width: a rank the tree did not
offer is not counted against it. The paths that took rank 0 at every depth before are also
counted apart (``RankProfile.line_rates``): a chain's drafts are those alone. Counts decay
geometrically (``half_life`` steps), so the profile follows the text being generated; a prior
(e.g. the head's training report) stands in for ``prior_weight`` exposures until real ones
outweigh it.

A depth is seen only in the steps of shapes that draft that deep, and an adaptive policy drafts
deep where the recent text was easy: a deep depth's rates, learned on easy stretches alone,
would price every later step as if it were easy too. So each depth also counts the first
depth's rank-0 rate over the steps that offered it, and its rates are scaled by the first
depth's rate over all steps against that (``profile``): if the steps that went deep took the
first draft 0.9 of the time where all steps took it 0.6, the deep depths are priced at
two thirds of what those steps accepted there.
"""

from __future__ import annotations

import itertools
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
        # per depth, the decayed paths that reached it by how many ranks the tree offered there
        # (at most max_rank; the prior's as offering all): rank j's exposures are those of the
        # counts above j, summed when read, so that recording a path costs one addition per
        # depth whatever the tree's width (it runs every step; the sums, when the estimate is
        # refreshed); ``_reached``: their total, rank 0's exposures, read every step
        self._offers = [[0.0] * max_rank + [prior_weight] for _ in range(max_depth)]
        self._reached = [prior_weight] * max_depth
        # the same of the paths that took rank 0 at every depth before: a chain's rates
        self._line_hits = [prior_weight * prior.chain_rate(d) for d in range(max_depth)]
        self._line_reached = [prior_weight] * max_depth
        # per depth, the first depth's rank-0 hits and exposures over the steps that offered it
        self._first_hits = [prior_weight * prior.chain_rate(0)] * max_depth
        self._first_reached = [prior_weight] * max_depth
        # what a count recorded now weighs: the counts decay by new ones weighing ever more (one
        # multiplication per step instead of one per count; only ratios are read)
        self._weight = 1.0

    def record(
        self, paths: Sequence[tuple[Sequence[int], Sequence[int]]], *, steps: float = 1.0
    ) -> int:
        """One verify step: per request ``(ranks, offered)``, ``ranks[d]`` the rank accepted
        at depth d + 1 (−1: none, the path ended there or before), ``offered[d]`` the
        candidates the tree offered at that depth under the accepted path (0 where the path did
        not reach it). The counts so far decay by ``steps`` steps first: the steps since the
        one recorded last (a caller may record one step in several, or count a step of fewer
        paths as part of one), 0 for more paths of that step. Returns the drafts the paths
        accepted, within the profile's depths."""
        if steps < 0:
            raise ValueError(f"steps must be at least 0, got {steps}")
        if steps:
            self._weight /= self._decay**steps
            if self._weight > _RESCALE_ABOVE:
                self._rescale()
        weight, depths, ranks_kept = self._weight, self.max_depth, self.max_rank
        offers, reached, hits = self._offers, self._reached, self._hits
        line_hits, line_reached = self._line_hits, self._line_reached
        accepted = offered_depths = 0
        first = line_hits[0], line_reached[0]
        # (runs every step for a few paths: no builtin calls inside the loop)
        for ranks, offered in paths:
            if len(offered) > offered_depths:
                offered_depths = len(offered)
            on_line = True
            depth = 0
            for rank, count in zip(ranks, offered, strict=False):  # halves of one row
                if depth == depths or count <= 0:
                    break
                offers[depth][count if count < ranks_kept else ranks_kept] += weight
                reached[depth] += weight
                if on_line:
                    line_reached[depth] += weight
                    on_line = rank == 0
                    if on_line:
                        line_hits[depth] += weight
                if rank < 0:
                    break
                if rank < ranks_kept:
                    hits[depth][rank] += weight
                depth += 1
            accepted += depth  # the depths it took a rank at, the first −1 ending them
        # the step's shape offered every depth its paths have a slot for (``paths`` of one
        # step): each counts the first depth's hits and exposures the paths just added
        first_hits, first_reached = line_hits[0] - first[0], line_reached[0] - first[1]
        for depth in range(min(offered_depths, depths)):
            self._first_hits[depth] += first_hits
            self._first_reached[depth] += first_reached
        return accepted

    def exposures(self, depth: int, rank: int) -> float:
        """The decayed exposures of ``rank`` at ``depth`` (0-based), in steps' worth now."""
        return _rank_exposures(self._offers[depth])[rank] / self._weight

    def top_rates(self) -> list[float]:
        """Per depth, the rate of rank 0 (hits / exposures): a cheap sign of how far the
        profile has moved."""
        pairs = zip(self._hits, self._reached, strict=True)
        return [hits[0] / reached if reached > 0 else 0.0 for hits, reached in pairs]

    def profile(self) -> RankProfile:
        """The current estimate: per depth, each rank's hits / exposures, scaled by how the
        first depth's rank-0 rate over all steps compares with its rate over the steps that
        offered this depth (see the module), capped by 1, by the rate of the rank before it and
        by what the ranks before it leave of 1.

        Rank 0 is offered wherever a path reaches a depth, so its rate is the plain mean. A
        lower rank is offered only where the tree kept it, and EAGLE keeps it where the draft
        was unsure, which is where the target takes it most: its hits / exposures overstate
        its rate, and a row of them can sum past 1. Scaling such a row down would take rank 0
        with it (a greedy head whose chains accept 0.93 a depth priced at 0.74); the caps take
        the excess from the ranks that carry it, and keep a row non-increasing as the draft's
        ranking is."""
        scales = self._selection_scales()
        rows = []
        for hits, offers, scale in zip(self._hits, self._offers, scales, strict=True):
            exposures = _rank_exposures(offers)
            row: list[float] = []
            left = cap = 1.0
            for h, e in zip(hits, exposures, strict=True):
                rate = min(scale * h / e if e > 0 else 0.0, cap, left)
                row.append(rate)
                left, cap = left - rate, rate
            rows.append(tuple(row))
        triples = zip(self._line_hits, self._line_reached, scales, strict=True)
        line = tuple(min(scale * h / r, 1.0) if r > 0 else 0.0 for h, r, scale in triples)
        return RankProfile(tuple(rows), line)

    def _selection_scales(self) -> list[float]:
        """Per depth, the first depth's rank-0 rate over every step (the line's) over its rate
        over the steps that offered the depth: 1 where every step did."""
        reached = self._line_reached[0]
        if reached <= 0:
            return [1.0] * self.max_depth
        everywhere = self._line_hits[0] / reached
        pairs = zip(self._first_hits, self._first_reached, strict=True)
        return [everywhere * r / h if h > 0 and r > 0 else 1.0 for h, r in pairs]

    def _rescale(self) -> None:
        """Divide every count and the weight by the weight (before it could overflow)."""
        scale = 1.0 / self._weight
        line = (self._line_hits, self._line_reached, self._first_hits, self._first_reached)
        for counts in (*self._hits, *self._offers, self._reached, *line):
            counts[:] = [count * scale for count in counts]
        self._weight = 1.0


_RESCALE_ABOVE = 1e12


def _rank_exposures(offers: list[float]) -> list[float]:
    """Per rank j, the paths whose tree offered more than j ranks: the sums of ``offers``
    (indexed by how many were offered, 0 unused) from j + 1 on."""
    return list(itertools.accumulate(reversed(offers)))[::-1][1:]
