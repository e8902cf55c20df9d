"""Benchmark report: what each shape's steps took and committed inside the adaptive rows of an
eagletree bench JSON (``eagletree bench --policy adaptive --out run``), beside the fixed
engines of the same cell; and how a fixed drafting engine's tokens a step at bs 1 follow from
one step to the next (their lag-1 autocorrelation: the persistence of easy and hard stretches
of text, which ``policy_replay --persistence`` models).

A cell's adaptive engine may commit less with a shape than the fixed engine of that shape does
(it runs the deep chain after the easy stretches that made it look best); the tokens a step of
each shape inside the adaptive row, against the fixed row's, show whether it does. Its steps'
median and mean apart: steps whose read-backs alternate, long after short, keep the fixed
engine's mean under a longer median; a mean over the fixed one's is time the row lost.

    python -m benchmarks.shape_steps --run all.json [--out shape_steps.md]

Host only: it reads the JSON (rows written before ``step_tokens`` was recorded show no
tokens).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagletree.app.bench.configs import ADAPTIVE_NAME, PLAIN


@dataclass(frozen=True, slots=True)
class ShapeSteps:
    """The steps of one shape in a row."""

    label: str
    steps: int
    share: float  # of the row's timed steps
    median_ms: float
    mean_ms: float
    tokens_per_step: float | None  # a request's, on average; None where not recorded


def shape_steps(row: Mapping[str, Any]) -> list[ShapeSteps]:
    """Each shape's steps in ``row`` (a fixed row: its one shape), most run first. Tokens a step
    are a request's: the step's tokens over the replica's batch (every request of a bench
    window decodes until its slowest has its tokens)."""
    ms: Sequence[float] = row["step_ms"]
    labels: Sequence[str] = row.get("step_shapes") or [row["config"]] * len(ms)
    tokens: Sequence[int] = row.get("step_tokens") or []
    replica = (row.get("replica_batch_sizes") or [row["batch_size"]])[0]
    grouped: dict[str, tuple[list[float], list[int]]] = {}
    for i, (label, step_ms) in enumerate(zip(labels, ms, strict=False)):
        times, counts = grouped.setdefault(label, ([], []))
        times.append(step_ms)
        if i < len(tokens):
            counts.append(tokens[i])
    result = [
        ShapeSteps(
            label,
            len(times),
            len(times) / len(ms),
            statistics.median(times),
            statistics.fmean(times),
            sum(counts) / len(counts) / replica if counts else None,
        )
        for label, (times, counts) in grouped.items()
    ]
    return sorted(result, key=lambda s: (-s.steps, s.label))


def lag_one(values: Sequence[float]) -> float | None:
    """The lag-1 autocorrelation of ``values`` (None for fewer than three or no spread)."""
    if len(values) < 3:
        return None
    mean = statistics.fmean(values)
    spread = sum((v - mean) ** 2 for v in values)
    if spread == 0:
        return None
    pairs = itertools.pairwise(values)
    return sum((a - mean) * (b - mean) for a, b in pairs) / spread


def report(data: Mapping[str, Any]) -> str:
    """Per cell: the adaptive row's shapes against the fixed rows; then the bs-1 persistence."""
    rows: Sequence[Mapping[str, Any]] = data["rows"]
    cells = sorted({(r["temperature"], r["batch_size"]) for r in rows})
    lines = [
        "| T | bs | shape | adaptive: share | median ms | mean ms | tokens a step "
        "| fixed: median ms | mean ms | tokens a step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for temperature, batch_size in cells:
        here = [r for r in rows if (r["temperature"], r["batch_size"]) == (temperature, batch_size)]
        adaptive = [r for r in here if r["config"] == ADAPTIVE_NAME]
        fixed = {
            steps.label: steps
            for r in here
            if r["config"] != ADAPTIVE_NAME
            for steps in shape_steps(r)
        }
        for r in adaptive:
            for steps in shape_steps(r):
                own = fixed.get(steps.label)
                lines.append(
                    f"| {temperature:g} | {batch_size} | {steps.label} | {steps.share:.0%} | "
                    f"{steps.median_ms:.3f} | {steps.mean_ms:.3f} | {_tokens(steps)} | "
                    f"{'— | —' if own is None else f'{own.median_ms:.3f} | {own.mean_ms:.3f}'} | "
                    f"{'—' if own is None else _tokens(own)} |"
                )
    lines += ["", "Fixed drafting engines at bs 1, lag-1 autocorrelation of tokens a step:", ""]
    for r in rows:
        if r["batch_size"] == 1 and r["config"] not in (PLAIN.name, ADAPTIVE_NAME):
            persistence = lag_one(r.get("step_tokens") or [])
            value = "—" if persistence is None else f"{persistence:+.2f}"
            lines.append(f"- T {r['temperature']:g}, {r['config']}: {value}")
    return "\n".join(lines)


def _tokens(steps: ShapeSteps) -> str:
    return "—" if steps.tokens_per_step is None else f"{steps.tokens_per_step:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run", type=Path, required=True, help="an eagletree bench JSON")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    if not args.run.is_file():
        parser.error(f"--run {args.run} is not a file: give an eagletree bench JSON")
    text = report(json.loads(args.run.read_text()))
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
