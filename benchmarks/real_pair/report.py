"""App: the real pair's report — its tables in markdown and the goals it is judged by.

``PairReport`` collects what a run has measured and rewrites ``report.json`` and ``report.md``
after every phase.

The goals it ends with are ``goals.py``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.real_pair.goals import Goal, acceptance_goals, speed_goals
from benchmarks.real_pair.speed import SpeedRow
from benchmarks.real_pair.table import HeadTable, best_tree_per_budget
from eagletree.app.training import acceptance_row
from eagletree.app.training.acceptance_row import AcceptanceRow, TreeShape


def speed_table(rows: Sequence[SpeedRow]) -> str:
    lines = [
        "| config | bs | tok/s | ms/step | tokens/step |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.config} | {row.batch_size} | {row.tokens_per_s:.0f} |"
            f" {row.ms_per_step:.2f} | {row.tokens_per_step:.2f} |"
        )
    return "\n".join(lines) + "\n"


def head_sections(
    name: str,
    table: HeadTable,
    trained: Mapping[str, Any] | None,
    simulated: Sequence[AcceptanceRow] = (),
) -> list[str]:
    lines = [f"## {name}", ""]
    if trained is not None:
        accuracy = " ".join(f"{a:.2f}" for a in trained["agreement_by_step"])
        coverage = trained.get("draft_vocab_coverage")
        lines += [
            f"Trained {trained['steps']} steps (train-draft's defaults), final loss"
            f" {trained['final_loss']:.3f}, top-1 agreement with the target by unrolled step"
            f" ({trained['agreement_source']}, teacher-forced): {accuracy}."
            + ("" if coverage is None else f" Draft vocabulary coverage {coverage:.1%}."),
            "",
        ]
    lines += [
        "Greedy continuations of held-out prompts:",
        "",
        acceptance_row.markdown_table(table.greedy),
    ]
    best = best_tree_per_budget(table.greedy)
    if best:
        lines += [
            "Best tree per verify budget: "
            + ", ".join(
                f"N {n}: {r.shape.label} {r.mean_accept_length:.2f}" for n, r in best.items()
            ),
            "",
        ]
    if table.fresh:
        lines += [
            "One verify step from fresh held-out contexts:",
            "",
            acceptance_row.markdown_table(table.fresh),
        ]
    if table.sampled:
        lines += [
            "Sampled (T = 1) continuations:",
            "",
            acceptance_row.markdown_table(table.sampled),
        ]
    if simulated:
        engine = {row.shape: row for row in table.greedy}
        ratios = [
            f"{row.shape.label} {row.mean_accept_length:.2f} (engine ÷ offline"
            f" {engine[row.shape].mean_accept_length / row.mean_accept_length:.2f})"
            for row in simulated
            if row.shape in engine and row.mean_accept_length > 0
        ]
        lines += [
            "Chains simulated offline with the head on the same prompts (tokens/step): "
            + (", ".join(ratios) or "no engine chain to compare with"),
            "",
        ]
    if table.not_measured:
        lines += [f"Not measured (time budget): {', '.join(table.not_measured)}", ""]
    return lines


def projected_speedup(
    table: HeadTable, shape: acceptance_row.TreeShape, step_ratio: float
) -> float | None:
    """Tokens per step of ``shape`` on this pair ÷ that shape's step time in units of a plain
    step of the big target (``eagletree bench``'s break-even τ there): the speedup the big target
    would see with this acceptance."""
    rows = [row for row in table.greedy if row.shape == shape]
    return rows[0].mean_accept_length / step_ratio if rows else None


class PairReport:
    """The report so far, rewritten to ``out`` after every phase so a run cut short by its time
    limit still leaves what it measured."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
        self.data["seconds"] = {}
        self.heads: dict[str, HeadTable] = {}
        self.lookup: list[AcceptanceRow] = []
        self.simulated: dict[str, list[AcceptanceRow]] = {}
        self.speed: list[SpeedRow] = []
        self.step_ratios = dict(zip(("eagle", "eagle3"), args.llama8b_step_ratio, strict=True))
        self._started = time.perf_counter()

    def phase(self, name: str) -> None:
        timings = self.data["seconds"]
        timings[name] = time.perf_counter() - self._started - sum(timings.values())
        print(f"[{name}] {timings[name]:.1f} s", file=sys.stderr, flush=True)
        self.write()

    def write(self) -> None:
        self.data["heads_measured"] = {k: t.as_dict() for k, t in self.heads.items()}
        self.data["prompt_lookup"] = [row.as_dict() for row in self.lookup]
        self.data["speed"] = [row.as_dict() for row in self.speed]
        self.data["simulated_chains"] = {
            name: [row.as_dict() for row in rows] for name, rows in self.simulated.items()
        }
        goals = acceptance_goals(self.heads, self.simulated, self.data.get("heads", {}))
        if self.speed:
            goals += speed_goals(self.speed)
        self.data["goals"] = [
            {"name": g.name, "ratio": g.ratio, "factor": g.factor, "met": g.met} for g in goals
        ]
        (self.out / "report.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.out / "report.md").write_text(render(self, goals))

    def markdown(self) -> str:
        return (self.out / "report.md").read_text()


def render(report: PairReport, goals: Sequence[Goal]) -> str:
    data = report.data
    lines = ["# Real pair: a Python-source Llama target and its trained draft heads", ""]
    if "corpus" in data:
        corpus = data["corpus"]
        lines.append(
            f"- corpus: {corpus['train_files']} training files"
            f" ({corpus['train_chars'] / 2**20:.1f} MiB), {corpus['held_out_files']} held out"
        )
    if "tokenizer" in data:
        lines.append(
            f"- tokenizer: byte-level BPE, {data['tokenizer']['vocab_size']} tokens;"
            f" {data['tokenizer']['train_tokens']:,} training tokens"
        )
    if "target" in data:
        target = data["target"]
        lines.append(
            f"- target: {target['parameters'] / 1e6:.1f} M parameters, {target['steps']} steps"
            f" ({target['tokens_seen'] / 1e6:.1f} M tokens), train loss"
            f" {target['final_train_loss']:.3f}, held-out loss {target['held_out_loss']:.3f},"
            f" held-out top-1 {target['held_out_top1']:.3f}"
        )
    if "plain_looping_share" in data:
        lines.append(f"- plain greedy continuations that loop: {data['plain_looping_share']:.0%}")
    lines += ["- time: " + ", ".join(f"{k} {v:.0f} s" for k, v in data["seconds"].items()), ""]
    for algorithm, check in data.get("exactness", {}).items():
        verdict = "identical" if check["identical"] else f"{check['match_rate']:.1%} matched"
        lines.append(
            f"- {algorithm}, {check['shape']} in {check['dtype']}: output vs plain decoding in"
            f" {check['dtype']}: {verdict}"
        )
    if report.lookup:
        lines += ["## Prompt lookup (model-free baseline)", "",
                  acceptance_row.markdown_table(report.lookup, "drafted tokens")]  # fmt: skip
    for algorithm, table in report.heads.items():
        lines += head_sections(
            algorithm, table, data.get("heads", {}).get(algorithm),
            report.simulated.get(algorithm, []),
        )  # fmt: skip
        ratio = report.step_ratios.get(algorithm)
        projected = None if ratio is None else projected_speedup(
            table, TreeShape(5, 4, 8), ratio
        )  # fmt: skip
        if projected is not None:
            lines += [
                f"Projected Llama-3.1-8B speedup at bs 1 with this acceptance: tree S5 k4 N8"
                f" emits its tokens per step in {ratio:.2f} plain steps → {projected:.2f}×",
                "",
            ]
    if report.speed:
        lines += [f"## Decode speed ({data.get('speed_head')} head)", "",
                  speed_table(report.speed)]  # fmt: skip
    lines += ["## Goals", "", *(goal.line() for goal in goals), ""]
    return "\n".join(lines)
