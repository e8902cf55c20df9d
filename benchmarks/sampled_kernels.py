"""Benchmark: what a sampled decode step runs that a greedy one does not, kernel by kernel.

On a small model a sampled speculative step costs 1.2–1.3 × a greedy one (chain S3 at bs 64 on
the H100's real pair: 1.2 ms at T 1, 0.93 at T 0) where the model's forwards are the same: the
difference is the sampling's own kernels (tempered softmax per draft depth and for the verified
nodes, the drafts' draws, the speculative-sampling walk, the coins), each cheap and each a
launch. This builds each engine of ``--engines`` over one checkpoint (random weights at the real
pair's dimensions by default, as ``host_profile``), decodes ``--batch-size`` requests greedily
and at ``--temperature``, profiles ``--steps`` decode steps of each with ``torch.profiler``
(graph replays included: CUPTI sees the kernels inside them) and prints, per kernel name, the
launches and device ms a step of each, largest difference first.

    python -m benchmarks.sampled_kernels --engines chain:S3 plain --batch-size 64
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from benchmarks.host_profile import add_checkpoint_options, checkpoint, engine_settings

if TYPE_CHECKING:
    from eagletree.app.bench.checkpoints import DraftKind

Kernels = dict[str, tuple[float, float]]  # name → (launches a step, device ms a step)


def profile_steps(
    target: Path,
    draft: Path,
    algorithm: DraftKind,
    engine: str,
    temperature: float,
    args: argparse.Namespace,
) -> tuple[Kernels, float]:
    """Per kernel name, its launches and device ms a decode step of ``engine`` at
    ``temperature``; and the wall ms a step under the profiler."""
    from eagletree.app.bench.profiling import profile_decode
    from eagletree.app.composition.container import build_engine
    from eagletree.domain.sampling import SamplingParams

    budget = args.warmup + args.steps + 8
    context = args.prompt_len + 8 * budget  # room for a head that accepts (a trained one)
    built = build_engine(
        engine_settings(target, draft, algorithm, engine, args.batch_size, context)
    )
    generator = torch.Generator().manual_seed(0)
    for index in range(args.batch_size):
        prompt = torch.randint(0, built.vocab_size, (args.prompt_len,), generator=generator)
        params = SamplingParams(max_new_tokens=budget, temperature=temperature, seed=index)
        built.submit(prompt.tolist(), params)
    while any(not r.is_prefilled for r in built.scheduler.running) or built.scheduler.waiting:
        built.step()
    for _ in range(args.warmup):
        built.step()
    counts = profile_decode(built, args.steps, torch.cuda.is_available(), top=10_000)
    built.close()
    kernels = {name: (calls, ms) for name, calls, ms in counts.top_kernels}
    return kernels, counts.wall_ms_per_step


def report(
    engine: str, greedy: Kernels, sampled: Kernels, walls: tuple[float, float], top: int
) -> list[str]:
    """The kernels of a greedy and a sampled step side by side, largest difference first."""
    names = sorted(
        set(greedy) | set(sampled),
        key=lambda n: -(sampled.get(n, (0.0, 0.0))[1] - greedy.get(n, (0.0, 0.0))[1]),
    )
    total = [sum(ms for _, ms in k.values()) for k in (greedy, sampled)]
    launches = [sum(calls for calls, _ in k.values()) for k in (greedy, sampled)]
    lines = [
        f"### {engine}: device ms a step greedy {total[0]:.3f} / sampled {total[1]:.3f} "
        f"({launches[0]:.0f} / {launches[1]:.0f} launches; wall under the profiler "
        f"{walls[0]:.3f} / {walls[1]:.3f} ms)",
        "",
        "| kernel | launches greedy / sampled | ms greedy / sampled | + ms |",
        "|---|---|---|---|",
    ]
    for name in names[:top]:
        g, s = greedy.get(name, (0.0, 0.0)), sampled.get(name, (0.0, 0.0))
        lines.append(
            f"| `{name}` | {g[0]:.1f} / {s[0]:.1f} | {g[1]:.4f} / {s[1]:.4f} | {s[1] - g[1]:+.4f} |"
        )
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_options(parser, ("chain:S3", "plain"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=16, help="decode steps before profiling")
    parser.add_argument("--steps", type=int, default=8, help="decode steps profiled")
    parser.add_argument("--top", type=int, default=30, help="kernels listed per engine")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    lines: list[str] = []
    with checkpoint(args) as (target, draft):
        for engine in args.engines:
            greedy, wall_greedy = profile_steps(target, draft, args.algorithm, engine, 0.0, args)
            sampled, wall_sampled = profile_steps(
                target, draft, args.algorithm, engine, args.temperature, args
            )
            lines += report(engine, greedy, sampled, (wall_greedy, wall_sampled), args.top)
            print("\n".join(lines[-args.top - 5 :]), flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
