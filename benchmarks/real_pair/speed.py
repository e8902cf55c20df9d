"""App: decode speed of a trained pair — plain, the best chain and the best tree, per batch size.

Each configuration gets one engine with the device's defaults (CUDA graphs and the overlap
scheduler where they resolve on), measured by ``eagletree bench``'s ``measure_decode`` on
held-out prompts: real text, so the tree rows carry the head's real acceptance. EOS does not end
a measured request (a finished request would leave the batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.real_pair.table import HeadTable, best_tree_per_budget
from eagletree.app.bench.measure import measure_decode
from eagletree.app.composition.container import build_engine
from eagletree.app.training.acceptance import engine_settings
from eagletree.app.training.acceptance_row import AcceptanceRow, TreeShape

WARMUP_STEPS = 2


@dataclass(frozen=True, slots=True)
class SpeedRow:
    config: str
    batch_size: int
    tokens_per_s: float
    ms_per_step: float
    tokens_per_step: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "batch_size": self.batch_size,
            "tokens_per_s": self.tokens_per_s,
            "ms_per_step": self.ms_per_step,
            "tokens_per_step": self.tokens_per_step,
        }


def measure_speed(
    target: Path,
    draft: Path,
    algorithm: str,
    shapes: Sequence[TreeShape | None],
    prompts: Sequence[Sequence[int]],
    batch_sizes: Sequence[int],
    new_tokens: int,
    device: str,
) -> list[SpeedRow]:
    """Rows for each shape (None: plain decoding) at each batch size (≤ ``len(prompts)``)."""
    rows = []
    largest = max(batch_sizes)
    for shape in shapes:
        per_step = 1 if shape is None else shape.num_steps + 1
        budget = (new_tokens + WARMUP_STEPS + 2) * per_step  # the fastest request's share
        context = max(len(p) for p in prompts) + 1 + budget
        settings = engine_settings(
            target,
            None if shape is None else draft,
            algorithm,
            shape,
            device,
            context,
            max_running_requests=largest,
        )
        engine = build_engine(settings)
        engine.eos_token_ids = frozenset()
        for bs in batch_sizes:
            m = measure_decode(
                engine,
                prompts[:bs],
                new_tokens=new_tokens,
                max_tokens_per_step=per_step,
                warmup_steps=WARMUP_STEPS,
                profile_steps=0,
                cuda=device.startswith("cuda"),
                max_new_tokens=budget,
            )
            rows.append(
                SpeedRow(
                    "plain" if shape is None else shape.label,
                    bs,
                    m.tokens_per_s,
                    m.ms_per_step,
                    m.tokens_per_step,
                )
            )
        engine.close()
    return rows


def speed_shapes(heads: dict[str, HeadTable]) -> tuple[str, list[TreeShape | None]]:
    """The head with the best greedy shape, and plain, its best chain and its best tree of each
    verify budget: the fastest tree is rarely the one that accepts most (a wide verify costs)."""

    def accept(rows: Sequence[AcceptanceRow]) -> float:
        return max((r.mean_accept_length for r in rows), default=0.0)

    algorithm = max(heads, key=lambda a: accept(heads[a].greedy))
    rows = heads[algorithm].greedy
    chains = [r for r in rows if r.shape.topk == 1]
    shapes: list[TreeShape | None] = [None]
    if chains:
        shapes.append(max(chains, key=lambda r: r.mean_accept_length).shape)
    shapes += [r.shape for r in best_tree_per_budget(rows).values()]
    return algorithm, shapes
