"""App: acceptance of a draft head measured through the real engine, greedy, on given prompts.

``emitted`` per verify step is accepted drafts + 1, so the acceptance at depth d is the share of
steps that accepted ≥ d drafts among those that accepted ≥ d − 1. A continuation *loops* when
its tail repeats with a short period — a target trained briefly does that, and a looping text
is easy to draft, so reports state the share.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from eagletree.app.engine import Engine
from eagletree.config.settings import EngineSettings
from eagletree.domain.request import AcceptanceStats


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape.label,
            "num_steps": self.shape.num_steps,
            "topk": self.shape.topk,
            "num_draft_tokens": self.shape.num_draft_tokens,
            "mean_accept_length": self.mean_accept_length,
            "per_depth": list(self.per_depth),
            "num_verify_steps": self.num_verify_steps,
            "matches_plain": self.matches_plain,
            "looping_share": self.looping_share,
            "seconds": self.seconds,
        }


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


def engine_settings(
    target: Path,
    draft: Path | None,
    algorithm: str,
    shape: TreeShape | None,
    device: str,
    max_context_len: int,
    backend: dict[str, str] | None = None,
) -> EngineSettings:
    """Settings of a greedy engine; on the CPU fp32 with the torch backends, else bf16 and
    the default (Triton) backends, ``backend`` overriding either."""
    on_cpu = device.startswith("cpu")
    speculative: dict[str, Any] = {"algorithm": "none"}
    if shape is not None:
        speculative = {
            "algorithm": algorithm,
            "num_steps": shape.num_steps,
            "eagle_topk": shape.topk,
            "num_draft_tokens": shape.num_draft_tokens,
        }
    return EngineSettings(
        model={
            "target_path": str(target),
            "draft_path": None if draft is None else str(draft),
            "dtype": "float32" if on_cpu else "bfloat16",
            "device": device,
            "max_context_len": max_context_len,
        },
        speculative=speculative,
        memory={"max_total_tokens": 1 << 16, "max_running_requests": 16},
        backend={
            **({"attention": "torch", "kv_move": "torch"} if on_cpu else {}),
            **(backend or {}),
        },
    )


def plain_outputs(
    target: Path,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    device: str,
    backend: dict[str, str] | None = None,
) -> list[list[int]]:
    context = _context(prompts, max_new_tokens)
    settings = engine_settings(target, None, "none", None, device, context, backend)
    engine = Engine.from_settings(settings)
    return [r.output_ids for r in engine.generate(prompts, max_new_tokens=max_new_tokens)]


def _context(prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
    return max(len(p) for p in prompts) + max_new_tokens + 1


def measure_acceptance(
    target: Path,
    draft: Path,
    algorithm: str,
    prompts: Sequence[Sequence[int]],
    shapes: Sequence[TreeShape],
    max_new_tokens: int,
    device: str,
    reference: Sequence[Sequence[int]] | None = None,
    backend: dict[str, str] | None = None,
    time_budget_s: float | None = None,
) -> list[AcceptanceRow]:
    """One row per shape, in order; ``reference`` (plain greedy outputs) checks losslessness.
    With ``time_budget_s`` no shape starts after the budget is spent (fewer rows come back)."""
    rows = []
    budget_started = time.perf_counter()
    for shape in shapes:
        if time_budget_s is not None and time.perf_counter() - budget_started > time_budget_s:
            break
        settings = engine_settings(
            target, draft, algorithm, shape, device, _context(prompts, max_new_tokens), backend
        )
        engine = Engine.from_settings(settings)
        started = time.perf_counter()
        results = engine.generate(prompts, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - started
        stats = engine.stats.acceptance or AcceptanceStats(0, 0)
        outputs = [r.output_ids for r in results]
        rows.append(
            AcceptanceRow(
                shape=shape,
                mean_accept_length=stats.mean_accept_length,
                per_depth=per_depth_acceptance(stats, shape.num_steps),
                num_verify_steps=stats.num_steps,
                matches_plain=None
                if reference is None
                else outputs == [list(r) for r in reference],
                looping_share=sum(map(is_looping, outputs)) / max(len(outputs), 1),
                seconds=seconds,
            )
        )
    return rows


def markdown_table(rows: Sequence[AcceptanceRow]) -> str:
    lines = [
        "| shape | mean accept length | acceptance by depth | lossless | looping |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        depths = " ".join(f"{rate:.2f}" for rate in row.per_depth)
        lossless = "-" if row.matches_plain is None else ("yes" if row.matches_plain else "NO")
        lines.append(
            f"| {row.shape.label} | {row.mean_accept_length:.2f} | {depths} | {lossless} |"
            f" {row.looping_share:.0%} |"
        )
    return "\n".join(lines) + "\n"
