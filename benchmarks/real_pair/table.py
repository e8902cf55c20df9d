"""App: the acceptance table of a target and its draft heads — chains against trees.

For one head it measures, through the engine: greedy continuations of held-out prompts for
every shape of a grid (chains S = depth, N = S + 1; trees of the same depths at each verify
budget N and beam width k that fit), then, for the chains and the best tree at each budget,
one verify step from many fresh held-out contexts and sampled (T = 1) continuations. Shapes
are measured in that order of importance, and none starts once the time budget is spent: what
is left is listed as not measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagletree.app.training import acceptance
from eagletree.app.training.acceptance_row import AcceptanceRow, TreeShape

GRID_SHARE = 0.6  # of a head's measuring budget, for its greedy grid


def shape_grid(
    depths: Sequence[int], budgets: Sequence[int], topks: Sequence[int]
) -> list[TreeShape]:
    """Chains first, then trees by width k (in ``topks`` order), budget N, depth S — those
    whose N nodes fit in the tree a k-wide beam of depth S can grow (N ≤ 1 + k + (S − 1)·k²).
    A time budget cuts from the end, so every budget and depth has its first-width tree
    before any second width is tried (a cut by budget left whole budgets unmeasured)."""
    chains = [TreeShape.chain(depth) for depth in depths]
    trees = [
        TreeShape(depth, k, n)
        for k in topks
        for n in budgets
        for depth in depths
        if k > 1 and n <= 1 + k + (depth - 1) * k * k
    ]
    return chains + trees


def _best_trees(
    rows: Sequence[AcceptanceRow], by: Callable[[TreeShape], int]
) -> dict[int, AcceptanceRow]:
    """``by(shape)`` → the tree row of that key with the highest mean acceptance length."""
    best: dict[int, AcceptanceRow] = {}
    for row in rows:
        key = by(row.shape)
        if row.shape.topk > 1 and (
            key not in best or row.mean_accept_length > best[key].mean_accept_length
        ):
            best[key] = row
    return dict(sorted(best.items()))


def best_tree_per_budget(rows: Sequence[AcceptanceRow]) -> dict[int, AcceptanceRow]:
    """N → the tree row of that verify budget with the highest mean acceptance length."""
    return _best_trees(rows, lambda shape: shape.num_draft_tokens)


def best_tree_per_depth(
    rows: Sequence[AcceptanceRow], max_budget: int = 32
) -> dict[int, AcceptanceRow]:
    """S → the best tree row of that depth with N ≤ ``max_budget``."""
    within = [row for row in rows if row.shape.num_draft_tokens <= max_budget]
    return _best_trees(within, lambda shape: shape.num_steps)


def chains_of(rows: Sequence[AcceptanceRow]) -> dict[int, AcceptanceRow]:
    return {row.shape.num_steps: row for row in rows if row.shape.topk == 1}


@dataclass(slots=True)
class HeadTable:
    """Everything measured for one head; ``not_measured`` names what the budget cut."""

    algorithm: str
    greedy: list[AcceptanceRow] = field(default_factory=list)
    fresh: list[AcceptanceRow] = field(default_factory=list)
    sampled: list[AcceptanceRow] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # per part of the measurement

    def as_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "greedy": [row.as_dict() for row in self.greedy],
            "fresh_contexts": [row.as_dict() for row in self.fresh],
            "sampled": [row.as_dict() for row in self.sampled],
            "not_measured": self.not_measured,
            "seconds": self.seconds,
        }

    def headline_shapes(self) -> list[TreeShape]:
        """The chains and the best tree of each budget, from the greedy rows."""
        chains = [row.shape for row in self.greedy if row.shape.topk == 1]
        return chains + [row.shape for row in best_tree_per_budget(self.greedy).values()]


@dataclass(frozen=True, slots=True)
class TableInputs:
    """What every head is measured on: held-out prompts, their plain greedy continuations,
    fresh contexts for one-step acceptance, and how the engines run."""

    target: Path
    prompts: Sequence[Sequence[int]]
    reference: Sequence[Sequence[int]]
    contexts: Sequence[Sequence[int]]
    max_new_tokens: int
    device: str
    backend: dict[str, str] | None = None
    seed: int = 0


def measure_head(
    inputs: TableInputs,
    head_dir: Path,
    algorithm: str,
    grid: Sequence[TreeShape],
    budget_s: float,
) -> HeadTable:
    """The greedy grid, then fresh contexts and T = 1 for the headline shapes, within
    ``budget_s`` seconds (a shape under way is finished). The grid may use ``GRID_SHARE`` of the
    budget, so the headline shapes' other measures are not crowded out by the first engines'
    kernel compilation."""
    table = HeadTable(algorithm)
    started = time.perf_counter()
    deadline = started + budget_s
    grid_deadline = started + GRID_SHARE * budget_s

    def continuations(shape: TreeShape, temperature: float) -> list[AcceptanceRow]:
        return acceptance.measure_acceptance(
            inputs.target,
            head_dir,
            algorithm,
            inputs.prompts,
            [shape],
            inputs.max_new_tokens,
            inputs.device,
            inputs.reference,
            inputs.backend,
            temperature=temperature,
            seed=inputs.seed,
        )

    for shape in grid:
        if time.perf_counter() > grid_deadline:
            table.not_measured.append(f"greedy {shape.label}")
            continue
        table.greedy += continuations(shape, 0.0)
    table.seconds["greedy"] = time.perf_counter() - started
    headline = table.headline_shapes()
    for shape in headline:
        if time.perf_counter() > deadline or not inputs.contexts:
            table.not_measured.append(f"fresh contexts {shape.label}")
            continue
        table.fresh.append(
            acceptance.first_step_acceptance(
                inputs.target,
                head_dir,
                algorithm,
                inputs.contexts,
                shape,
                inputs.device,
                inputs.backend,
            )
        )
    table.seconds["fresh contexts"] = time.perf_counter() - started - table.seconds["greedy"]
    for shape in headline:
        if time.perf_counter() > deadline:
            table.not_measured.append(f"T=1 {shape.label}")
            continue
        table.sampled += continuations(shape, 1.0)
    table.seconds["T=1"] = time.perf_counter() - started - sum(table.seconds.values())
    return table


def lookup_table(inputs: TableInputs, depths: Sequence[int]) -> list[AcceptanceRow]:
    """The prompt-lookup baseline at each depth, on the greedy continuations."""
    return [acceptance.lookup_acceptance(d, inputs.prompts, inputs.reference) for d in depths]
