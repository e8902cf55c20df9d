"""The goals a trained pair is judged by (its heads' acceptance, and the speed rows' when
measured).

Each goal compares two measured figures and says whether the first reaches ``factor`` × the
second; a goal whose figures were not measured (time budget, a head left out) is reported as
such, never as met.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.real_pair.speed import SpeedRow
from benchmarks.real_pair.table import HeadTable, best_tree_per_budget
from eagletree.app.training.acceptance_row import AcceptanceRow, TreeShape

# the shapes the goals compare: measured first, so that a time budget cuts the others
GOAL_SHAPES = (
    TreeShape.chain(5),
    TreeShape.chain(7),
    TreeShape.chain(6),
    TreeShape(6, 8, 32),
)


def goal_shapes_first(grid: Sequence[TreeShape]) -> list[TreeShape]:
    """``grid`` with the goals' shapes it holds moved to the front, in ``GOAL_SHAPES`` order."""
    first = [shape for shape in GOAL_SHAPES if shape in grid]
    return first + [shape for shape in grid if shape not in first]


@dataclass(frozen=True, slots=True)
class Goal:
    name: str
    value: float | None
    reference: float | None
    factor: float
    absolute: bool = False  # a bar on the value itself (reference 1), not a comparison

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference:
            return None
        return self.value / self.reference

    @property
    def met(self) -> bool | None:
        ratio = self.ratio
        return None if ratio is None else ratio >= self.factor

    def line(self) -> str:
        if self.ratio is None:
            return f"- {self.name}: not measured"
        verdict = "met" if self.met else "MISSED"
        if self.absolute:
            return f"- {self.name}: {self.value:.2f} (goal ≥ {self.factor:g}) — {verdict}"
        return (
            f"- {self.name}: {self.value:.2f} vs {self.reference:.2f} = {self.ratio:.2f}×"
            f" (goal ≥ {self.factor:g}×) — {verdict}"
        )


def _accept(row: AcceptanceRow | None) -> float | None:
    return None if row is None else row.mean_accept_length


def _shape_row(rows: Sequence[AcceptanceRow], shape: TreeShape) -> AcceptanceRow | None:
    return next((row for row in rows if row.shape == shape), None)


def _lowest_agreement(trained: Mapping[str, Any] | None) -> float | None:
    agreement = (trained or {}).get("agreement_by_step") or []
    return min(agreement, default=None)


def acceptance_goals(
    heads: Mapping[str, HeadTable],
    simulated: Mapping[str, Sequence[AcceptanceRow]],
    trained: Mapping[str, Mapping[str, Any]],
) -> list[Goal]:
    """The heads' goals, from what was measured: heads trained with train-draft's
    defaults agree ≥ 0.75 at every unrolled step; the tree S6 k8 N32 beats chain S6 by 1.2×;
    the engine's chain S7 reaches 0.9× the same head's offline chain S7; EAGLE-3 ≥ 1.05 ×
    EAGLE-1 at chains S5, S7 and the best tree of N 32 (all greedy, T = 0)."""
    goals: list[Goal] = []
    for name in sorted({*heads, *trained}):
        goals.append(
            Goal(
                f"{name}: teacher-forced top-1 agreement at its lowest unrolled step",
                _lowest_agreement(trained.get(name)),
                1.0,
                0.75,
                absolute=True,
            )
        )
    for name, table in heads.items():
        chain6 = _shape_row(table.greedy, TreeShape.chain(6))
        goals.append(
            Goal(
                f"{name}: tree S6 k8 N32 vs chain S6",
                _accept(_shape_row(table.greedy, TreeShape(6, 8, 32))),
                _accept(chain6),
                1.2,
            )
        )
        goals.append(
            Goal(
                f"{name}: engine chain S7 vs the same head's chain S7 simulated offline",
                _accept(_shape_row(table.greedy, TreeShape.chain(7))),
                _accept(_shape_row(simulated.get(name, []), TreeShape.chain(7))),
                0.9,
            )
        )
    if "eagle" in heads and "eagle3" in heads:
        eagle, eagle3 = heads["eagle"].greedy, heads["eagle3"].greedy
        for depth in (5, 7):
            goals.append(
                Goal(
                    f"EAGLE-3 vs EAGLE-1: chain S{depth}",
                    _accept(_shape_row(eagle3, TreeShape.chain(depth))),
                    _accept(_shape_row(eagle, TreeShape.chain(depth))),
                    1.05,
                )
            )
        goals.append(
            Goal(
                "EAGLE-3 vs EAGLE-1: best tree of N 32",
                _accept(best_tree_per_budget(eagle3).get(32)),
                _accept(best_tree_per_budget(eagle).get(32)),
                1.05,
            )
        )
    return goals


def speed_goals(rows: Sequence[SpeedRow]) -> list[Goal]:
    at_bs1 = {row.config: row.tokens_per_s for row in rows if row.batch_size == 1}
    plain = at_bs1.get("plain")
    chains = [v for k, v in at_bs1.items() if k.startswith("chain")]
    trees = [v for k, v in at_bs1.items() if k.startswith("tree")]
    best_tree = max(trees, default=None)
    best_spec = max(chains + trees, default=None)
    return [
        Goal("tok/s at bs 1: best tree vs best chain", best_tree, max(chains, default=None), 1.15),
        Goal("tok/s at bs 1: speculative vs plain", best_spec, plain, 2.0),
    ]
