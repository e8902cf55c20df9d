"""What a CPU replay reads of a GPU bench JSON of an adaptive engine (``eagletree bench
--policy adaptive --out run``): per cell (batch size, temperature) each fixed configuration's
measured step seconds and tokens a step, the adaptive engine's start-up cost table, its
candidate shapes and the head's rank profiles it started from, and the tok/s the GPU measured
for it (``benchmarks/policy_replay.py``)."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.config.shape_policy import parse_shape
from eagletree.domain.draft_shape import DraftShape, RankProfile


@dataclass(frozen=True, slots=True)
class Cell:
    """One (batch size, temperature) of the run: each fixed shape's measured step seconds and
    tokens a step (plain: the plain engine's)."""

    batch_size: int
    temperature: float
    seconds: dict[DraftShape, list[float]]
    tokens_per_step: dict[DraftShape, float]
    tokens_per_s: dict[DraftShape, float]  # as the GPU measured them
    # each fixed row's windows (draws of prompts), whose steps ``seconds`` holds in order
    windows: dict[DraftShape, int] = field(default_factory=dict)
    # (before, after): how much longer the adaptive engine's steps of ``after`` took right
    # after a step of ``before`` than after one of their own shape (``switch_offsets``)
    switch_offsets: dict[tuple[DraftShape, DraftShape], float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Run:
    """What a replay reads of a bench JSON."""

    cells: list[Cell]
    costs: StepCosts
    candidates: tuple[DraftShape, ...]  # the adaptive engine's, its configured shape first
    drawn: bool
    new_tokens: int
    repeats: int
    measured: Mapping[tuple[int, float], float]  # the GPU's adaptive tok/s per cell
    # the head's rank profiles by class, as its report gave them to the engine (runs written
    # before they were recorded: none)
    head_priors: Mapping[str, RankProfile] = field(default_factory=dict)


def read_run(path: Path) -> Run:
    """The cells, costs and adaptive engine of the bench JSON at ``path``."""
    data = json.loads(path.read_text())
    adaptive = data.get("adaptive") or {}
    engine = data["settings"]["engines"].get("adaptive")
    if not adaptive or engine is None:
        raise SystemExit(f"{path}: no adaptive engine (run eagletree bench --policy adaptive)")
    state = adaptive.get("adaptive") or next(iter(adaptive.values()))
    shapes: dict[str, DraftShape] = {}
    seconds: dict[tuple[DraftShape, int, bool], float] = {}
    for row in state["step_costs"]:
        shape = DraftShape(row["num_steps"], row["topk"], row["num_draft_tokens"])
        shapes[row["shape"]] = shape
        seconds[(shape, row["bucket"], row["sampled"])] = row["measured_ms"] / 1e3
    catch_ups = {(r["bucket"], r["sampled"]): r["measured_ms"] / 1e3 for r in state["catch_ups"]}
    every = state["catch_ups"][0]["every"] if state["catch_ups"] else 1
    buckets = tuple(sorted({bucket for _, bucket, _ in seconds}))
    cells: dict[tuple[int, float], Cell] = {}
    measured: dict[tuple[int, float], float] = {}
    adaptive_rows = []
    for row in data["rows"]:
        key = (row["batch_size"], row["temperature"])
        if row["config"].startswith("adaptive"):
            measured[key] = row["tokens_per_s"]
            adaptive_rows.append(row)
            continue
        cell = cells.setdefault(key, Cell(*key, {}, {}, {}))
        shape = shapes[row["config"]]
        cell.seconds[shape] = [ms / 1e3 for ms in row["step_ms"]]
        cell.tokens_per_step[shape] = row["tokens_per_step"]
        cell.tokens_per_s[shape] = row["tokens_per_s"]
        cell.windows[shape] = max(1, len(row.get("window_tokens_per_s") or ()))
    for row in adaptive_rows:
        row_cell = cells.get((row["batch_size"], row["temperature"]))
        if row_cell is not None and row.get("step_shapes"):
            names, times = row["step_shapes"], row["step_ms"]
            # a catch-up is no candidate's step: None, and no switch is read across it
            steps = [(shapes.get(name), ms / 1e3) for name, ms in zip(names, times, strict=True)]
            row_cell.switch_offsets.update(switch_offsets(steps))
    speculative = engine["speculative"]
    argv = data["settings"]["argv"]
    return Run(
        sorted(cells.values(), key=lambda c: (c.temperature, c.batch_size)),
        StepCosts(buckets, seconds, catch_ups, every),
        tuple(parse_shape(spec) for spec in speculative["candidate_shapes"]),
        speculative.get("sampled_drafts") == "drawn",
        argv["new_tokens"],
        argv.get("repeats", 1),
        measured,
        {
            name: RankProfile(tuple(tuple(float(rate) for rate in row) for row in rows))
            for name, rows in state.get("head_priors", {}).items()
        },
    )


# the fewest steps after a switch, and of the shape's own, an offset is read from
_SWITCHES_READ = 10


def switch_offsets(
    steps: Sequence[tuple[DraftShape | None, float]],
) -> dict[tuple[DraftShape, DraftShape], float]:
    """From an adaptive engine's steps in order (shape or None, seconds): for each switch (before,
    after) seen at least ``_SWITCHES_READ`` times, the median seconds of ``after``'s steps right
    after ``before``'s minus the median of those right after its own. With overlap a step's
    time is the interval between two read-backs, and where the host loop is the bottleneck
    the one after a switch carries some of the host work of the step before (on the H100, T 1,
    bs 32: chain S1 after chain S2 took 0.771 ms, after chain S1 0.697)."""
    own: dict[DraftShape, list[float]] = {}
    switched: dict[tuple[DraftShape, DraftShape], list[float]] = {}
    for (before, _), (after, seconds) in itertools.pairwise(steps):
        if before is None or after is None:
            continue
        if before == after:
            own.setdefault(after, []).append(seconds)
        else:
            switched.setdefault((before, after), []).append(seconds)
    return {
        pair: statistics.median(seconds) - statistics.median(own[pair[1]])
        for pair, seconds in switched.items()
        if len(seconds) >= _SWITCHES_READ and len(own.get(pair[1], ())) >= _SWITCHES_READ
    }
