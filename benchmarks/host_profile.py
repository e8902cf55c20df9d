"""Benchmark: where a decode step's host time goes, per engine, from ``cProfile``.

A small model at a large batch is host-bound (the device waits for the Python loop), so two
engines whose graphs take the same device time can differ by what their loops do around them.
This builds each engine of ``--engines`` over one checkpoint (random weights at the given
dimensions by default: ``eagletree init-random`` options), runs ``--batch-size`` requests of
``--new-tokens`` under ``cProfile`` after a warm-up generate, and prints the wall time per step
and the functions that took the most host time of their own (µs per step), engine by engine.
An engine is ``plain``, a fixed shape (``chain:S5``, ``tree:S6,k8,N32``) or ``adaptive:`` and
the candidate shapes separated by ``/`` (``adaptive:chain:S5/tree:S6,k8,N32``: without plain,
an adaptive engine over a head that accepts nothing still drafts).

    python -m benchmarks.host_profile --out host_profile.md
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from eagletree.app.bench.checkpoints import DraftKind
    from eagletree.app.bench.configs import BenchConfig
    from eagletree.config.settings import EngineSettings

DEFAULT_ENGINES = ("chain:S5", "adaptive:chain:S5/tree:S6,k8,N32")
# the real pair's dimensions (benchmarks/real_pair): a 12-layer Llama of width 768
REAL_PAIR_DIMS = (
    "--arch llama --draft eagle3 --vocab-size 16384 --hidden-size 768 --intermediate-size 2048 "
    "--num-layers 12 --num-heads 12 --num-kv-heads 4"
)


def _config(engine: str) -> BenchConfig:
    """The bench configuration ``engine`` names (see the module's docstring)."""
    from eagletree.app.bench.configs import BenchConfig, parse_config

    if not engine.startswith("adaptive:"):
        return parse_config(engine)
    specs = engine.removeprefix("adaptive:").split("/")
    shapes = tuple(parse_config(spec).shape for spec in specs)
    return BenchConfig(next(s for s in shapes if not s.is_plain), shapes)


def most_tokens_per_step(engine: str) -> int:
    """The most tokens one step of ``engine`` commits (its deepest shape's depth and bonus)."""
    config = _config(engine)
    return max(s.tokens_per_step for s in (config.shape, *config.candidates))


def engine_settings(
    target: Path, draft: Path, algorithm: DraftKind, engine: str, batch_size: int, context: int
) -> EngineSettings:
    """Settings of ``engine`` over the checkpoint, its speculation as `eagletree bench` sets it,
    the pool sized for ``batch_size`` requests of ``context`` tokens."""
    from eagletree.app.bench.plan import BenchPlan, settings_for
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.draft_shape import reserved_slots

    config = _config(engine)
    window = reserved_slots((config.shape, *config.candidates))
    base = EngineSettings()
    cuda = torch.cuda.is_available()
    model = base.model.model_copy(
        update={
            "target_path": str(target),
            "draft_path": str(draft),
            "device": "cuda" if cuda else "cpu",
            "max_context_len": context + window,
        }
    )
    memory = base.memory.model_copy(
        update={
            "max_running_requests": batch_size,
            "max_total_tokens": batch_size * (context + window + 16),
        }
    )
    base = base.model_copy(update={"model": model, "memory": memory})
    return settings_for(BenchPlan(base, target, draft, algorithm, cuda), config)


def profile_engine(
    target: Path, draft: Path, algorithm: DraftKind, engine: str, args: argparse.Namespace
) -> list[str]:
    """The report lines of one engine: wall per step, then its top functions by own time."""
    from eagletree.app.composition.container import build_engine

    context = args.prompt_len + args.new_tokens + 8
    settings = engine_settings(target, draft, algorithm, engine, args.batch_size, context)
    engine_obj = build_engine(settings)
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, engine_obj.vocab_size, (args.prompt_len,), generator=generator).tolist()
        for _ in range(args.batch_size)
    ]
    engine_obj.generate(prompts, max_new_tokens=16, temperature=args.temperature, seed=0)
    steps_before = engine_obj.stats.num_steps
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    engine_obj.generate(
        prompts, max_new_tokens=args.new_tokens, temperature=args.temperature, seed=0
    )
    profiler.disable()
    elapsed = time.perf_counter() - started
    steps = engine_obj.stats.num_steps - steps_before
    engine_obj.close()
    stats = pstats.Stats(profiler)
    table: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda item: -item[1][2])[: args.top]
    # the loop's waits for the device: a step's read-back (its event) and any other sync
    waited = sum(
        own
        for (_, _, name), (_, _, own, _, _) in table.items()
        if "synchronize" in name or name == "<method 'item' of 'torch._C.TensorBase' objects>"
    )
    lines = [
        f"### {engine} (bs {args.batch_size}, T {args.temperature}): {steps} steps, "
        f"{1e3 * elapsed / steps:.3f} ms a step under the profiler, "
        f"{1e6 * waited / steps:.1f} µs of it waiting for the device",
        "",
        "The loop waits little where it is the bottleneck (the device idles for it instead).",
        "",
        "| function | calls/step | own µs/step | total µs/step |",
        "|---|---|---|---|",
    ]
    for (filename, line, name), (_, calls, own, total, _) in rows:
        where = f"{Path(filename).name}:{line} {name}" if line else name
        lines.append(
            f"| `{where}` | {calls / steps:.1f} | {1e6 * own / steps:.1f} | "
            f"{1e6 * total / steps:.1f} |"
        )
    return [*lines, ""]


def add_checkpoint_options(parser: argparse.ArgumentParser, engines: Sequence[str]) -> None:
    """The options naming the checkpoint (random at the real pair's dimensions by default) and
    the engines to build over it."""
    parser.add_argument("--target", type=Path, help="target checkpoint (default: random)")
    parser.add_argument("--draft-dir", type=Path, help="draft checkpoint (with --target)")
    parser.add_argument("--algorithm", default="eagle3", choices=["eagle", "eagle3"])
    parser.add_argument("--engines", nargs="+", default=list(engines))


@contextlib.contextmanager
def checkpoint(args: argparse.Namespace) -> Iterator[tuple[Path, Path]]:
    """The (target, draft) directories ``args`` name, or a random pair at the real pair's
    dimensions, written into a temporary directory for as long as the block runs."""
    with tempfile.TemporaryDirectory() as scratch:
        if args.target is not None:
            yield args.target, args.draft_dir
            return
        from eagletree.app.cli.init_random import main as init_random

        init_random([*REAL_PAIR_DIMS.split(), "--out", scratch])
        yield Path(scratch) / "target", Path(scratch) / "draft"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_options(parser, DEFAULT_ENGINES)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--top", type=int, default=25, help="functions listed per engine")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    lines = []
    with checkpoint(args) as (target, draft):
        for engine in args.engines:
            lines += profile_engine(target, draft, args.algorithm, engine, args)
            print("\n".join(lines[-args.top - 8 :]), flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
