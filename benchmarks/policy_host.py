"""Benchmark: the adaptive shape policy's host time per decode step, by batch size.

A speculative step of the adaptive worker adds host work the fixed one does not: choosing the
shape (``AdaptiveShapes.choose``) and, at read-back, learning the step's time and accepted paths
(``StepFeedback``'s observer: the read-back clock, ``observe_time``, each sampled request's path
from the engine's rows, ``observe``). Where the engine is host-bound (a small model at bs 8–64)
that work lengthens every step, so it is measured here alone, as the engine drives it: the
default candidate set (``DEFAULT_CANDIDATES``) priced by the real pair's step times on the H100
(chain S1 / S2 / S3 close at T 1, so the policy moves between them as a real batch does),
requests of one temperature (greedy, or T 1) whose every step accepts a chain's drafts up to a
length varying by request and step, each step read back one step late (overlap) through the
rows the engine's commit hands over. Each row runs 1,000 steps first (the expected tokens'
refreshes thin out to one per 64 steps) and reports µs per step, median of ``--repeats``
blocks of ``--steps`` steps: the choice, the read-back and their sum.

    python -m benchmarks.policy_host --out policy_host.md

Host only (no model, no device).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence
from operator import itemgetter
from pathlib import Path

from eagletree.app.engine.worker import ReadRows, StepObserver
from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.step_costs import ReadBackClock, StepCosts
from eagletree.app.workers.shapes.step_feedback import StepFeedback
from eagletree.app.workers.step_graphs import graph_buckets
from eagletree.config.shape_policy import DEFAULT_CANDIDATES, parse_shape
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams

BATCH_SIZES = (1, 8, 32, 64, 256)
WARMUP_STEPS = 1000
# ms a step of the real pair on the H100 at T 1, bs 32 (docs/benchmarks.md, 2026-12-07 19:17);
# every other shape (the default set's tree) as the tree S8 k4 N32's
_STEP_MS = {"plain": 0.47, "chain:S1": 0.68, "chain:S2": 0.84, "chain:S3": 0.95, "chain:S5": 1.18}
_OTHER_MS = 2.3


def _step_seconds(shapes: Sequence[DraftShape]) -> dict[DraftShape, float]:
    """Each of ``shapes``' step, in seconds."""
    by_shape = {parse_shape(spec): ms for spec, ms in _STEP_MS.items()}
    return {shape: 1e-3 * by_shape.get(shape, _OTHER_MS) for shape in shapes}


def _costs(step_seconds: Mapping[DraftShape, float], buckets: Sequence[int]) -> StepCosts:
    """Every bucket and sampling priced alike: the choice is the acceptance's to make."""
    return StepCosts(
        tuple(buckets),
        {
            (shape, bucket, sampled): seconds
            for shape, seconds in step_seconds.items()
            for bucket in buckets
            for sampled in (False, True)
        },
    )


def _rows(batch_size: int, shape: DraftShape, step: int) -> list[list[int]]:
    """The engine's read-back rows of a step: the tokens, then num_emitted and num_committed
    (a chain's accepted length varies by request and step; a tree's observed columns, none of
    its drafts accepted, follow)."""
    depth = shape.num_steps
    rows = []
    for i in range(batch_size):
        accepted = (i + step) % (depth + 1) if shape.topk == 1 else 0
        observed = [] if shape.topk == 1 else [-1] * depth + [shape.topk] + [0] * (depth - 1)
        rows.append([1] * (depth + 1) + [accepted + 1, accepted + 1] + observed)
    return rows


def time_policy(
    batch_size: int, temperature: float, steps: int, repeats: int
) -> tuple[float, float]:
    """Median µs of one step's choice and of its read-back."""
    shapes = [parse_shape(spec) for spec in DEFAULT_CANDIDATES]
    policy = AdaptiveShapes(shapes)
    step_seconds = _step_seconds(shapes)
    policy.use_costs(_costs(step_seconds, graph_buckets(max(BATCH_SIZES))))
    elapsed = [0.0]  # the read-back clock: each step as long as its shape's
    feedback = StepFeedback(policy, ReadBackClock(lambda: elapsed[0]))
    params = SamplingParams(max_new_tokens=64, temperature=temperature, seed=0)
    decode = [Request(i, [1, 2], params, 64) for i in range(batch_size)]
    for request in decode:  # well into their outputs, as most of a serving batch is
        request.output_ids.extend([3] * 16)
    sampled = temperature > 0
    # every shape's rows, made outside the timing (the engine's read-back makes them whatever
    # the policy)
    rows = {shape: [_rows(batch_size, shape, step) for step in range(8)] for shape in shapes}
    in_flight: list[tuple[StepObserver | None, list[list[int]], int]] = []

    def run(count: int, offset: int) -> tuple[float, float]:
        chose = read = 0.0
        for step in range(offset, offset + count):
            started = time.perf_counter()
            shape = policy.choose(decode)
            chosen = time.perf_counter()
            feedback.launched()
            observer = feedback.observer(
                shape, timed=True, paths=not shape.is_plain, catch_up=False, sampled=sampled
            )
            elapsed[0] += step_seconds[shape]
            launched = time.perf_counter()
            if in_flight:  # the step before is read back once this one is launched
                before, its_rows, width = in_flight.pop()
                if before is not None:
                    before(decode, ReadRows(its_rows, itemgetter(slice(width, None))))
            done = time.perf_counter()
            in_flight.append((observer, rows[shape][step % 8], shape.num_steps + 1))
            chose += chosen - started
            read += done - launched
        return chose, read

    run(WARMUP_STEPS, 0)
    blocks = [run(steps, WARMUP_STEPS + block * steps) for block in range(repeats)]
    costs = policy.costs
    if (
        costs is None
        or not policy.learned_profiles()
        or not any(costs.observations(shape, batch_size, sampled) for shape in shapes)
    ):
        raise RuntimeError("the read-backs taught the policy nothing: no time, or no path")
    return (
        statistics.median(chose for chose, _ in blocks) / steps * 1e6,
        statistics.median(read for _, read in blocks) / steps * 1e6,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    parser.add_argument("--steps", type=int, default=500, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per row")
    args = parser.parse_args(argv)
    lines = [
        "Adaptive policy host time per decode step (µs): the choice + the read-back (its time",
        "and paths learned)",
        "",
        "| bs | greedy | T 1 |",
        "|---|---|---|",
    ]
    for batch_size in BATCH_SIZES:
        cells = []
        for temperature in (0.0, 1.0):
            chose, read = time_policy(batch_size, temperature, args.steps, args.repeats)
            cells.append(f"{chose:.1f} + {read:.1f} = {chose + read:.1f}")
        lines.append(f"| {batch_size} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out is not None:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
