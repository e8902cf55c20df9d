"""Domain: the shape of a speculative step — draft depth S, beam width k, verified nodes N — and
how many tokens such a step is expected to commit, given how often the target takes each of the
draft's candidates.

A step of shape (S, k, N) drafts S levels of a k-wide beam, verifies the N − 1 best candidates
under the pending token (the root) and commits 1 + the accepted drafts. ``PLAIN`` (S = 0,
N = 1) is a step without drafts: one token.

**Expected accepted drafts.** Let ``r[d][j]`` be the probability that, with the path accepted
through depth d, the target's next token is the draft's (j + 1)-th candidate there (the
*rank profile*, measured from committed steps: ``acceptance_profile``). A node is accepted iff
every edge of its path is, and siblings exclude each other, so a tree whose nodes are the rank
paths P commits ``Σ_{p ∈ P} Π_{(d, j) ∈ p} r[d][j]`` drafts in expectation. The nodes of a
shape are the ones EAGLE's drafting would pick if the draft's path scores were these
probabilities: the beam keeps the k best paths at every depth, and the N − 1 best of all
candidates are verified (``tree_rank_paths``). A chain (k = 1) is the special case
``Σ_{d ≤ S} Π_{e ≤ d} c[e]``, where ``c[e]`` is the rate of the draft's first candidate on
paths that took the first candidate at every depth before (``RankProfile.chain_rate``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

RankPath = tuple[int, ...]  # the candidate rank chosen at each depth, root excluded


# the most plain steps whose tokens the draft leaves unread (docs/speculative.md): while steps
# are launch-bound a catch-up costs one draft forward whatever its width (on the H100 the real
# pair's catch-up over 16 pairs a row took 0.11 / 0.16 ms over a plain step at bs 1 / 64, over
# 32 pairs 0.12 / 0.20), so the more plain steps share it the less each pays (a lag of 6, chain
# S5's window, cost a weak head's plain steps 4 %); the buffer holds that many target features
# per row (200 MB for 256 rows of a Llama-3-8B EAGLE-3 target's 3 x 4096 bf16 aux states,
# whose catch-up is compute-bound: there a narrower lag would cost as little)
MAX_LAG = 32


def draft_lag_width(shapes: Sequence[DraftShape]) -> int:
    """How many plain steps' tokens a row's draft may leave unread among steps of ``shapes``:
    ``MAX_LAG`` where plain decoding is one of them, else 1 (no plain step leaves any)."""
    return MAX_LAG if any(s.is_plain for s in shapes) else 1


def reserved_slots(shapes: Sequence[DraftShape]) -> int:
    """Slots kept backed past a request's committed length for steps of ``shapes``: twice the
    widest block one of them writes there — a drafting step's window, or a catch-up's block as
    wide as the draft's lag, which starts behind the committed length and reaches up to its
    width past it — so that a step can launch before the host learns the lengths the one in
    flight commits (the scheduler's reserve, the request table's rows)."""
    return 2 * max(draft_lag_width(shapes), *(s.window_len for s in shapes))


def max_draft_tokens(num_steps: int, topk: int) -> int:
    """Largest N: the root plus k first-step candidates plus k² per later step."""
    return 1 + topk + (num_steps - 1) * topk * topk


@dataclass(frozen=True, slots=True, order=True)
class DraftShape:
    """Draft depth ``num_steps`` (S), beam width ``topk`` (k), nodes verified
    ``num_draft_tokens`` (N, the root included). S = 0 is plain decoding (k = 1, N = 1)."""

    num_steps: int
    topk: int
    num_draft_tokens: int
    # derived once (a step reads them every time): plain decoding; most tokens one step commits
    # (S accepted drafts and the bonus, within N); window slots one step writes past the
    # committed length (the draft's S·k, the verify's N)
    is_plain: bool = field(init=False, compare=False, repr=False)
    tokens_per_step: int = field(init=False, compare=False, repr=False)
    window_len: int = field(init=False, compare=False, repr=False)
    # the adaptive policy keys its tables by shape and compares shapes every step: a hash
    # computed once, and equality by identity first, spare it the generated methods' tuples
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        s, k, n = self.num_steps, self.topk, self.num_draft_tokens
        object.__setattr__(self, "_hash", hash((s, k, n)))
        object.__setattr__(self, "is_plain", s == 0)
        object.__setattr__(self, "tokens_per_step", min(s + 1, n))
        object.__setattr__(self, "window_len", max(s * k, n))
        if s == 0:
            if (k, n) != (1, 1):
                raise ValueError(f"plain decoding has topk 1 and 1 node, got topk {k}, N {n}")
            return
        if s < 0 or k < 1 or n < 2:
            raise ValueError(f"a draft shape needs S >= 1, k >= 1, N >= 2; got {self.label}")
        if k == 1 and n != s + 1:
            raise ValueError(f"a chain of depth {s} verifies {s + 1} nodes, got N {n}")
        if n > max_draft_tokens(s, k):
            raise ValueError(
                f"{self.label}: N - 1 = {n - 1} exceeds the {max_draft_tokens(s, k) - 1} "
                f"candidates a depth-{s}, width-{k} beam drafts"
            )

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, DraftShape):
            return NotImplemented
        return self._hash == other._hash and (
            self.num_steps == other.num_steps
            and self.topk == other.topk
            and self.num_draft_tokens == other.num_draft_tokens
        )

    @staticmethod
    def chain(num_steps: int) -> DraftShape:
        return DraftShape(num_steps, 1, num_steps + 1)

    @property
    def label(self) -> str:
        s, k, n = self.num_steps, self.topk, self.num_draft_tokens
        if s == 0:
            return "plain"
        return f"chain S{s}" if k == 1 else f"tree S{s} k{k} N{n}"


PLAIN = DraftShape(0, 1, 1)


@dataclass(frozen=True, slots=True)
class RankProfile:
    """``hit_rates[d][j]``: P(the target takes the draft's (j+1)-th candidate at depth d + 1 |
    the path is accepted through depth d). Rows may be shorter than a shape needs: a depth past
    the last row repeats the last row, a rank past a row's end continues the row's last ratio
    (``rate``), so a profile measured on narrow trees still prices wider ones."""

    hit_rates: tuple[tuple[float, ...], ...]
    # per depth, P(the draft's first candidate is taken | the path took the first candidate at
    # every depth before): a chain's rates, where they were measured apart (``chain_rate``)
    line_rates: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.hit_rates or not all(self.hit_rates):
            raise ValueError("a rank profile needs at least one rate at every depth it lists")
        for depth, row in enumerate(self.hit_rates):
            if any(not 0.0 <= r <= 1.0 for r in row) or sum(row) > 1.0 + 1e-9:
                raise ValueError(f"depth {depth + 1}: rates {row} are not disjoint probabilities")
        if any(not 0.0 <= r <= 1.0 for r in self.line_rates):
            raise ValueError(f"line rates {self.line_rates} are not probabilities")

    def chain_rate(self, depth: int) -> float:
        """The rate of a chain's draft at ``depth`` (0-based): the line rate where measured
        (repeating its last past the end), else rank 0's. Rank 0's rate counts every path that
        reached the depth, through whichever ranks; a chain's drafts follow the draft's first
        candidates only, where the text is the easier (on the real pair at T 0, tree steps'
        rank-0 rates priced a chain S5 at 4.7 tokens a step where it committed 5.2)."""
        if self.line_rates:
            return self.line_rates[min(depth, len(self.line_rates) - 1)]
        return self.rate(depth, 0)

    def rate(self, depth: int, rank: int) -> float:
        """r[depth][rank] (both 0-based), extrapolated past the measured rows and ranks."""
        row = self.hit_rates[min(depth, len(self.hit_rates) - 1)]
        if rank < len(row):
            return row[rank]
        if len(row) < 2 or row[-2] <= 0.0:
            return 0.0
        ratio = min(row[-1] / row[-2], 1.0)
        value = row[-1] * ratio ** (rank - len(row) + 1)
        # never more than the probability the row leaves unclaimed
        return min(value, max(0.0, 1.0 - sum(row)))


def mean_profile(first: RankProfile, second: RankProfile) -> RankProfile:
    """The rank-by-rank mean of two profiles, over the depths and ranks either lists (the
    other's extrapolated there): a temperature between the two they were measured at."""
    depths = max(len(first.hit_rates), len(second.hit_rates))
    rows = []
    for depth in range(depths):
        ranks = max(len(p.hit_rates[min(depth, len(p.hit_rates) - 1)]) for p in (first, second))
        rows.append(
            tuple(0.5 * (first.rate(depth, j) + second.rate(depth, j)) for j in range(ranks))
        )
    line: tuple[float, ...] = ()
    if first.line_rates or second.line_rates:
        lines = max(len(first.line_rates), len(second.line_rates), depths)
        line = tuple(0.5 * (first.chain_rate(d) + second.chain_rate(d)) for d in range(lines))
    return RankProfile(tuple(rows), line)


def fit_under(kept: Sequence[float], rest: Sequence[float]) -> tuple[float, ...]:
    """``kept`` then ``rest``, the latter scaled down where together they would claim more than
    the whole probability: a row of disjoint rates whose first ones are trusted."""
    room = max(0.0, 1.0 - sum(kept))
    scale = min(1.0, room / sum(rest)) if sum(rest) > 0 else 1.0
    return (*kept, *(scale * r for r in rest))


def with_lower_ranks(first: RankProfile, lower: RankProfile) -> RankProfile:
    """``first``'s rates with ``lower``'s at the ranks beyond them, scaled down where the two
    would claim more than the whole probability: a profile measured for the first few
    candidates only (drawn drafts), widened to price wider trees."""
    depths = max(len(first.hit_rates), len(lower.hit_rates))
    rows = []
    for depth in range(depths):
        own = first.hit_rates[min(depth, len(first.hit_rates) - 1)]
        ranks = len(lower.hit_rates[min(depth, len(lower.hit_rates) - 1)])
        rows.append(fit_under(own, [lower.rate(depth, j) for j in range(len(own), ranks)]))
    return RankProfile(tuple(rows), first.line_rates)


def tree_rank_paths(shape: DraftShape, profile: RankProfile) -> list[tuple[float, RankPath]]:
    """The non-root nodes of ``shape`` as (probability the node is accepted, its rank path),
    best first: a k-wide beam over S depths whose path scores are the profile's products, then
    the N − 1 best of every drafted candidate (ties towards the shallower, lower-ranked one)."""
    if shape.is_plain:
        return []
    k = shape.topk
    candidates: list[tuple[float, RankPath]] = []
    beam: list[tuple[float, RankPath]] = [(1.0, ())]
    for depth in range(shape.num_steps):
        rates = _rates(profile, depth, k)  # the same under every beam node
        expanded = [(score * rates[j], (*path, j)) for score, path in beam for j in range(k)]
        candidates.extend(expanded)
        beam = heapq.nsmallest(k, expanded, key=_best_first)
    return heapq.nsmallest(shape.num_draft_tokens - 1, candidates, key=_best_first)


def expected_accepted(shape: DraftShape, profile: RankProfile) -> float:
    """Expected accepted drafts of one step of ``shape`` (tokens committed = 1 + this): the
    sum of ``tree_rank_paths``' scores, computed on the scores alone. Which of two equal
    scores a beam or the final cut keeps changes no score kept (a node's children score its
    score times the same rates), so the sum needs no paths, and building them was most of the
    adaptive policy's host time at a batch of 64 (the host loop is the step's bottleneck
    there)."""
    if shape.is_plain:
        return 0.0
    k = shape.topk
    candidates: list[float] = []
    beam = [1.0]
    for depth in range(shape.num_steps):
        rates = _rates(profile, depth, k)
        expanded = [score * rate for score in beam for rate in rates]
        candidates += expanded
        beam = heapq.nlargest(k, expanded)
    return math.fsum(heapq.nlargest(shape.num_draft_tokens - 1, candidates))


def _rates(profile: RankProfile, depth: int, topk: int) -> list[float]:
    """The rates of the ``topk`` candidates a beam node expands at ``depth``: a chain's line
    rate, or the profile's ranks."""
    if topk == 1:
        return [profile.chain_rate(depth)]
    return [profile.rate(depth, j) for j in range(topk)]


def _best_first(node: tuple[float, RankPath]) -> tuple[float, int, RankPath]:
    score, path = node
    return (-score, len(path), path)


@dataclass(frozen=True, slots=True)
class ShapeChoice:
    """The shape chosen for a step and the committed tokens per second it is expected to give;
    ``rates``: every candidate's, in the candidates' order."""

    shape: DraftShape
    tokens_per_second: float
    rates: tuple[float, ...] = ()


def choose_shape(
    candidates: Sequence[DraftShape],
    step_seconds: Sequence[float],
    accepted: Sequence[Sequence[float]],
    current: DraftShape | None = None,
    hysteresis: float = 0.0,
    counts: Sequence[int] | None = None,
) -> ShapeChoice:
    """The candidate that commits the most tokens per second for one batch.

    ``step_seconds[i]``: the measured time of one step of ``candidates[i]`` at this batch's
    size and sampling; ``accepted[i]``: each request's expected accepted drafts under it, or,
    with ``counts``, each group's (``counts[g]`` requests alike, e.g. of one temperature band).
    The step commits ``Σ (1 + accepted)`` tokens. With ``current`` among the candidates, another
    shape is chosen only when it is more than ``hysteresis`` (a fraction) faster, so that noise
    in the estimates does not flip the shape every step. Ties go to the earlier candidate.
    """
    if not candidates or len(step_seconds) != len(candidates) or len(accepted) != len(candidates):
        raise ValueError("one step time and one list of accepted drafts per candidate")
    rates = [
        sum(n * (1.0 + a) for n, a in zip(counts or [1] * len(per_group), per_group, strict=True))
        / seconds
        for per_group, seconds in zip(accepted, step_seconds, strict=True)
    ]
    best = max(range(len(candidates)), key=lambda i: (rates[i], -i))
    if current is not None and current in candidates:
        kept = candidates.index(current)
        if rates[best] <= rates[kept] * (1.0 + hysteresis):
            best = kept
    return ShapeChoice(candidates[best], rates[best], tuple(rates))
