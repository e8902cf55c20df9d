"""Benchmark: a decode step's host time by section of the engine's loop, engine by engine.

``host_profile`` (cProfile) says which functions a loop spends its time in, but the profiler
slows every Python call, the more the more calls a section makes, so two engines' loops compare
badly under it. This one times a few sections of the loop by wrapping their methods for the
timed steps only, with ``time.perf_counter`` and nothing else: the engine's step, the
scheduler, the worker's step and, inside it, its step runner (the input fill, the device step
function where it runs eagerly, a CUDA graph's replay call), the wait for a step's tokens on the
host, the commit of a read-back step and an adaptive policy's choice and learning. The report
gives each section's µs per step and the loop's own host time: the step less the eager device
step function and the wait — what two engines' loops differ by where the device waits for the
host (a small model at a large batch). Engines, checkpoints and options as ``host_profile``'s.

    python -m benchmarks.host_sections --out host_sections.md
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.host_profile import (
    DEFAULT_ENGINES,
    add_checkpoint_options,
    checkpoint,
    engine_settings,
    most_tokens_per_step,
)

if TYPE_CHECKING:
    from eagletree.app.bench.checkpoints import DraftKind

# the loop's own host time: the step less these (time on the device's account)
ON_DEVICE = ("device step function", "wait for the tokens")


def sections() -> list[tuple[str, type | ModuleType, str]]:
    """(label, owner, attribute) of every timed section; a label may name several owners."""
    from eagletree.app.engine import pipeline
    from eagletree.app.engine.loop import Engine
    from eagletree.app.engine.scheduler import Scheduler
    from eagletree.app.engine.transfers import PendingStep
    from eagletree.app.workers.decode_inputs import DecodeInputBuffers
    from eagletree.app.workers.non_speculative import NonSpeculativeWorker
    from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
    from eagletree.app.workers.shapes.step_feedback import StepFeedback
    from eagletree.app.workers.speculative_worker import SpeculativeWorker
    from eagletree.app.workers.step_graphs import DecodeStepRunner

    found: list[tuple[str, type | ModuleType, str]] = [
        ("engine step", Engine, "step"),
        ("schedule", Scheduler, "schedule"),
        ("worker step", SpeculativeWorker, "step"),
        ("worker step", NonSpeculativeWorker, "step"),
        ("step runner", DecodeStepRunner, "run"),
        ("input fill", DecodeInputBuffers, "fill"),
        ("device step function", DecodeStepRunner, "_step"),
        ("wait for the tokens", PendingStep, "rows"),
        ("commit", pipeline, "commit_step"),
        ("policy: choose", AdaptiveShapes, "choose"),
        ("policy: learn", StepFeedback, "_read_back"),
    ]
    if torch.cuda.is_available():
        found.append(("graph replay call", torch.cuda.CUDAGraph, "replay"))
    return found


@contextlib.contextmanager
def timed_sections(
    timed: Sequence[tuple[str, type | ModuleType, str]],
) -> Iterator[dict[str, float]]:
    """Seconds spent in each section's label while inside (the originals restored after)."""
    totals: dict[str, float] = defaultdict(float)
    saved: list[tuple[type | ModuleType, str, Any]] = []
    for label, owner, name in timed:
        original = vars(owner)[name]
        saved.append((owner, name, original))
        setattr(owner, name, _timing(original, label, totals))
    try:
        yield totals
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _timing(
    original: Callable[..., Any], label: str, totals: dict[str, float]
) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - started

    return timed


def measure_engine(
    target: Path, draft: Path, algorithm: DraftKind, engine: str, args: argparse.Namespace
) -> dict[str, float]:
    """µs per decode step of each section over ``args.steps`` steps of ``args.batch_size``
    requests, after their prefill and ``args.warmup`` steps."""
    from eagletree.app.composition.container import build_engine
    from eagletree.domain.sampling import SamplingParams

    # every request decodes through the timed steps whatever a step commits (a drafting step
    # of an easy random model commits its whole depth)
    budget = most_tokens_per_step(engine) * (args.warmup + args.steps) + 8
    context = args.prompt_len + budget
    built = build_engine(
        engine_settings(target, draft, algorithm, engine, args.batch_size, context)
    )
    built.eos_token_ids = frozenset()  # as the bench: an EOS would end a request mid-timing
    generator = torch.Generator().manual_seed(0)
    for index in range(args.batch_size):
        prompt = torch.randint(0, built.vocab_size, (args.prompt_len,), generator=generator)
        params = SamplingParams(max_new_tokens=budget, temperature=args.temperature, seed=index)
        built.submit(prompt.tolist(), params)
    while any(not r.is_prefilled for r in built.scheduler.running) or built.scheduler.waiting:
        built.step()
    for _ in range(args.warmup):
        built.step()
    with timed_sections(sections()) as totals:
        for _ in range(args.steps):
            if len(built.scheduler.running) < args.batch_size:
                raise RuntimeError(
                    f"{engine}: {len(built.scheduler.running)} of {args.batch_size} requests "
                    "still decoding at a timed step: their sections would be times of a smaller "
                    "batch, or of none"
                )
            built.step()
    built.close()
    per_step = {label: 1e6 * seconds / args.steps for label, seconds in totals.items()}
    per_step["host: the step less the device's"] = per_step["engine step"] - sum(
        per_step.get(label, 0.0) for label in ON_DEVICE
    )
    return per_step


def report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> list[str]:
    """A markdown table: a row per section, a column per engine (µs per step)."""
    engines = list(results)
    labels: list[str] = []
    for per_step in results.values():
        labels += [label for label in per_step if label not in labels]
    lines = [
        f"### host time per decode step by section (bs {args.batch_size}, T {args.temperature}, "
        f"{args.steps} steps)",
        "",
        "| section | " + " | ".join(f"{e} µs" for e in engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    for label in labels:
        cells = [f"{results[e].get(label, 0.0):.1f}" for e in engines]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_options(parser, ["plain", *DEFAULT_ENGINES])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=32, help="decode steps before timing")
    parser.add_argument("--steps", type=int, default=128, help="decode steps timed")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    with checkpoint(args) as (target, draft):
        results = {
            engine: measure_engine(target, draft, args.algorithm, engine, args)
            for engine in args.engines
        }
    lines = report(results, args)
    print("\n".join(lines), flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
