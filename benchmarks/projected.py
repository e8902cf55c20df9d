"""Benchmark: what each draft shape would give on one engine's step costs with another's
acceptance — the real pair's learned rank profiles on the Llama-3.1-8B cost table, say, where
no trained 8B head exists here.

    eagletree bench --preset llama3-8b --policy adaptive ... --out 8b      # the costs
    eagletree bench --target T --draft-dir D --policy adaptive ... --out pair   # the rates
    python -m benchmarks.projected --costs 8b.json --rates pair.json --out projected.md

Both are `eagletree bench` JSONs with an adaptive engine (their ``adaptive`` entry: its step
costs, and the rank profile it learned per temperature band); ``--rates`` may also be a head's
``training.json`` (its ``rank_profile``: greedy for T ≤ 0.5, sampled above). Per batch size
(the cost table's buckets) and temperature: the plain step's tok/s and every shape's ÷ plain,
expected tokens per step from the profile through the shape's tree (``expected_accepted``),
each step priced as the adaptive engine learned it (``--cost measured``: the replayed graphs
alone), and the best. A projection: the acceptance of one pair, the costs of another.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagletree.app.workers.shapes.band_acceptance import band_of
from eagletree.domain.draft_shape import DraftShape, RankProfile, expected_accepted

Costs = dict[tuple[DraftShape, int, bool], float]  # seconds per step


def _adaptive(data: dict[str, Any], path: Path) -> dict[str, Any]:
    engines = data.get("adaptive") or {}
    if not engines:
        raise SystemExit(f"{path}: no adaptive engine (run eagletree bench with --policy adaptive)")
    return dict(next(iter(engines.values())))


def read_costs(path: Path, kind: str) -> Costs:
    """The first adaptive engine's step costs in ``path`` (``kind``: learned or measured)."""
    costs: Costs = {}
    for row in _adaptive(json.loads(path.read_text()), path)["step_costs"]:
        shape = DraftShape(row["num_steps"], row["topk"], row["num_draft_tokens"])
        costs[(shape, int(row["bucket"]), bool(row["sampled"]))] = row[f"{kind}_ms"] / 1e3
    return costs


def read_profiles(path: Path) -> dict[str, RankProfile]:
    """Rank profiles by temperature band: an adaptive engine's learned ones, or a head's
    training report's (greedy for the greedy bands, sampled for the hotter ones)."""
    data = json.loads(path.read_text())
    if "rank_profile" in data:
        rows = data["rank_profile"]
        greedy, sampled = (_profile(rows[kind]) for kind in ("greedy", "sampled"))
        return {"greedy": greedy, "T<=0.5": greedy, "T<=0.85": sampled, "T>0.85": sampled}
    adaptive = _adaptive(data, path)
    lines = adaptive.get("line_rates", {})  # a chain's own rates, where the run kept them
    return {
        band: _profile(rows, lines.get(band, ()))
        for band, rows in adaptive["rank_profiles"].items()
    }


def _profile(rows: Sequence[Sequence[float]], line: Sequence[float] = ()) -> RankProfile:
    return RankProfile(tuple(tuple(float(r) for r in row) for row in rows), tuple(line))


def project(
    costs: Costs, profiles: dict[str, RankProfile], temperatures: Sequence[float]
) -> list[str]:
    """The markdown table: a row per temperature and bucket."""
    shapes = sorted({shape for shape, _, _ in costs}, key=lambda s: (s.num_steps, s.topk))
    drafting = [s for s in shapes if not s.is_plain]
    buckets = sorted({bucket for _, bucket, _ in costs})
    lines = [
        "| T | bs | plain tok/s | " + " | ".join(f"{s.label} ÷ plain" for s in drafting)
        + " | best |",
        "|---|---|---|" + "---|" * len(drafting) + "---|",
    ]  # fmt: skip
    for temperature in temperatures:
        band = band_of(temperature)
        if band not in profiles:
            raise SystemExit(
                f"--rates has no rank profile for T {temperature:g} (band {band}); it has"
                f" {', '.join(sorted(profiles))}: measure that temperature, or leave it out"
            )
        profile, sampled = profiles[band], temperature > 0
        for bucket in buckets:
            rates = {
                shape: bucket * (1 + expected_accepted(shape, profile))
                / costs[(shape, bucket, sampled)]
                for shape in shapes
            }  # fmt: skip
            plain = next(rate for shape, rate in rates.items() if shape.is_plain)
            best = max(shapes, key=lambda shape: rates[shape])
            cells = [f"{rates[s] / plain:.2f}" for s in drafting]
            lines.append(
                f"| {temperature:g} | {bucket} | {plain:,.0f} | " + " | ".join(cells)
                + f" | {best.label} ({rates[best] / plain:.2f}) |"
            )  # fmt: skip
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", type=Path, required=True, help="an adaptive bench's JSON")
    parser.add_argument("--rates", type=Path, required=True, help="a bench JSON or training.json")
    parser.add_argument("--cost", choices=["learned", "measured"], default="learned")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    costs = read_costs(args.costs, args.cost)
    table = "\n".join(project(costs, read_profiles(args.rates), args.temperatures)) + "\n"
    print(table, end="")
    if args.out is not None:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
