"""App: a row of acceptance measurements — the tree shape, its statistics, the markdown table.

``emitted`` per verify step is accepted drafts + 1, so the acceptance at depth d is the share of
steps that accepted ≥ d drafts among those that accepted ≥ d − 1. A continuation *loops* when
its tail repeats with a short period — a target trained briefly does that, and a looping text
is easy to draft, so a row states the share and the acceptance of the continuations that do
not loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from eagletree.domain.acceptance_stats import AcceptanceStats


class TreeShape(NamedTuple):
    """(S, k, N): draft depth, beam width, tree nodes including the root."""

    num_steps: int
    topk: int
    num_draft_tokens: int

    @property
    def label(self) -> str:
        if self.topk == 1:
            return f"chain S={self.num_steps}"
        return f"tree S={self.num_steps} k={self.topk} N={self.num_draft_tokens}"

    @staticmethod
    def chain(num_steps: int) -> TreeShape:
        return TreeShape(num_steps, 1, num_steps + 1)


@dataclass(frozen=True, slots=True)
class AcceptanceRow:
    shape: TreeShape
    mean_accept_length: float
    per_depth: tuple[float, ...]  # acceptance at depth 1..S
    num_verify_steps: int
    matches_plain: bool | None  # greedy speculative output equals plain output (None: unchecked)
    looping_share: float
    seconds: float
    temperature: float = 0.0
    non_looping_accept_length: float | None = None  # over the continuations that do not loop
    # mean share of each plain output reproduced before the first differing token (None:
    # unchecked); below 1 in bf16, where a near tie can round the other way in a tree verify
    match_rate: float | None = None

    @staticmethod
    def of(
        shape: TreeShape,
        per_request: Sequence[AcceptanceStats],
        outputs: Sequence[Sequence[int]],
        *,
        matches_plain: bool | None,
        seconds: float,
        temperature: float = 0.0,
        reference: Sequence[Sequence[int]] | None = None,
    ) -> AcceptanceRow:
        """The row of requests whose verify steps emitted ``per_request[i]`` for ``outputs[i]``;
        ``reference`` (plain outputs of the same prompts) gives the match rate."""
        looping = [is_looping(output) for output in outputs]
        total = merged(per_request)
        steady = merged([s for s, loops in zip(per_request, looping, strict=True) if not loops])
        return AcceptanceRow(
            shape=shape,
            mean_accept_length=total.mean_accept_length,
            per_depth=per_depth_acceptance(total, shape.num_steps),
            num_verify_steps=total.num_steps,
            matches_plain=matches_plain,
            looping_share=sum(looping) / max(len(looping), 1),
            seconds=seconds,
            temperature=temperature,
            non_looping_accept_length=steady.mean_accept_length if steady.num_steps else None,
            match_rate=None if reference is None else match_rate(outputs, reference),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape.label,
            "num_steps": self.shape.num_steps,
            "topk": self.shape.topk,
            "num_draft_tokens": self.shape.num_draft_tokens,
            "temperature": self.temperature,
            "mean_accept_length": self.mean_accept_length,
            "non_looping_accept_length": self.non_looping_accept_length,
            "per_depth": list(self.per_depth),
            "num_verify_steps": self.num_verify_steps,
            "matches_plain": self.matches_plain,
            "match_rate": self.match_rate,
            "looping_share": self.looping_share,
            "seconds": self.seconds,
        }


def match_rate(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> float:
    """Mean over requests of the share of the reference reproduced up to the first difference."""
    shares = []
    for output, expected in zip(outputs, reference, strict=True):
        same = 0
        for got, want in zip(output, expected, strict=False):
            if got != want:
                break
            same += 1
        shares.append(same / len(expected) if expected else 1.0)
    return sum(shares) / max(len(shares), 1)


def merged(stats: Sequence[AcceptanceStats]) -> AcceptanceStats:
    """One histogram of several requests' verify steps."""
    width = max((len(s.histogram) for s in stats), default=0)
    histogram = [sum(s.histogram[i] for s in stats if i < len(s.histogram)) for i in range(width)]
    return AcceptanceStats(
        sum(s.num_steps for s in stats), sum(s.num_emitted for s in stats), tuple(histogram)
    )


def per_depth_acceptance(stats: AcceptanceStats, depth: int) -> tuple[float, ...]:
    """Conditional acceptance at depths 1..depth from the emitted-per-step histogram."""
    rates = []
    for d in range(1, depth + 1):
        reached = sum(stats.histogram[d:])  # accepted ≥ d − 1 drafts: emitted ≥ d tokens
        passed = sum(stats.histogram[d + 1 :])
        rates.append(passed / reached if reached else 0.0)
    return tuple(rates)


def is_looping(tokens: Sequence[int], max_period: int = 32, min_tail: int = 24) -> bool:
    """The last max(3·p, min_tail) tokens repeat with some period p ≤ max_period."""
    for period in range(1, max_period + 1):
        tail = max(3 * period, min_tail)
        if len(tokens) < tail + period:
            break
        start = len(tokens) - tail
        if all(tokens[i] == tokens[i - period] for i in range(start, len(tokens))):
            return True
    return False


def markdown_table(rows: Sequence[AcceptanceRow], label: str = "shape") -> str:
    lines = [
        f"| {label} | T | mean accept length | non-looping | acceptance by depth | lossless |"
        " looping |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        depths = " ".join(f"{rate:.2f}" for rate in row.per_depth)
        lossless = "-" if row.matches_plain is None else ("yes" if row.matches_plain else "NO")
        if row.matches_plain is False and row.match_rate is not None:
            lossless = f"{row.match_rate:.1%} matched"
        steady = row.non_looping_accept_length
        lines.append(
            f"| {row.shape.label} | {row.temperature:g} | {row.mean_accept_length:.2f} |"
            f" {'-' if steady is None else f'{steady:.2f}'} | {depths} | {lossless} |"
            f" {row.looping_share:.0%} |"
        )
    return "\n".join(lines) + "\n"
