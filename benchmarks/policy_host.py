"""Benchmark: the adaptive shape policy's host time per decode step, by batch size.

A speculative step of the adaptive worker adds host work the fixed one does not: choosing the
shape (``AdaptiveShapes.choose``) and, at read-back, learning the step's time and accepted paths
(``observe_time``, ``observe``). Where the engine is host-bound (a small model at bs 32–64) that
work lengthens every step, so it is measured here alone: the default candidate set
(``DEFAULT_CANDIDATES``), a cost table that makes a drafting shape the choice, requests of one
temperature (greedy, or T 1) whose every step accepts a path of rank-0 drafts of varying depth.
Each row runs 1,000 steps first (the expected tokens' refreshes thin out to one per 64 steps)
and reports µs per step, median of ``--repeats`` blocks of ``--steps`` steps.

    python -m benchmarks.policy_host --out policy_host.md

Host only (no model, no device).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.app.workers.step_graphs import graph_buckets
from eagletree.config.shape_policy import DEFAULT_CANDIDATES, parse_shape
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams

BATCH_SIZES = (1, 8, 32, 64, 256)
WARMUP_STEPS = 1000


def _costs(shapes: Sequence[DraftShape], buckets: Sequence[int]) -> StepCosts:
    """A step costs 1 ms plus 0.1 ms per drafted depth: chains and trees are priced apart."""
    return StepCosts(
        tuple(buckets),
        {
            (shape, bucket, sampled): 1e-3 * (1 + 0.1 * shape.num_steps)
            for shape in shapes
            for bucket in buckets
            for sampled in (False, True)
        },
    )


def _paths(batch_size: int, depth: int, step: int) -> list[list[int]]:
    """Per request: ranks then offers of a path of rank-0 drafts, its length varying."""
    paths = []
    for i in range(batch_size):
        accepted = (i + step) % (depth + 1)
        ranks = [0] * accepted + [-1] * (depth - accepted)
        offered = [1] * min(accepted + 1, depth) + [0] * (depth - min(accepted + 1, depth))
        paths.append(ranks + offered)
    return paths


def time_policy(batch_size: int, temperature: float, steps: int, repeats: int) -> float:
    """Median µs of one step's choose + observe_time + observe."""
    shapes = [parse_shape(spec) for spec in DEFAULT_CANDIDATES]
    policy = AdaptiveShapes(shapes)
    policy.use_costs(_costs(shapes, graph_buckets(max(BATCH_SIZES))))
    params = SamplingParams(max_new_tokens=64, temperature=temperature, seed=0)
    decode = [Request(i, [1, 2], params, 64) for i in range(batch_size)]
    for request in decode:  # well into their outputs, as most of a serving batch is
        request.output_ids.extend([3] * 16)
    sampled = temperature > 0
    # the rows a read-back hands over, per depth, made outside the timing (the engine's
    # commit makes them whatever the policy)
    rows = {
        shape.num_steps: [_paths(batch_size, shape.num_steps, step) for step in range(8)]
        for shape in shapes
    }

    def run(count: int, offset: int) -> None:
        for step in range(offset, offset + count):
            shape = policy.choose(decode)
            policy.observe_time(shape, batch_size, sampled, 1e-3)
            if not shape.is_plain:
                policy.observe(shape, decode, rows[shape.num_steps][step % 8])

    run(WARMUP_STEPS, 0)
    blocks = []
    for block in range(repeats):
        started = time.perf_counter()
        run(steps, WARMUP_STEPS + block * steps)
        blocks.append((time.perf_counter() - started) / steps * 1e6)
    return statistics.median(blocks)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    parser.add_argument("--steps", type=int, default=500, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per row")
    args = parser.parse_args(argv)
    lines = [
        "Adaptive policy host time per decode step (µs): choose + observe_time + observe",
        "",
        "| bs | greedy | T 1 |",
        "|---|---|---|",
    ]
    for batch_size in BATCH_SIZES:
        greedy, hot = (time_policy(batch_size, t, args.steps, args.repeats) for t in (0.0, 1.0))
        lines.append(f"| {batch_size} | {greedy:.0f} | {hot:.0f} |")
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out is not None:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
