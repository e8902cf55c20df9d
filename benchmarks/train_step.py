"""Benchmark: where one `train-draft` optimizer step spends its time.

The step count a `--max-minutes` budget buys decides how far a head gets (docs/training.md,
"The sweep"), so the step itself is measured: ms per step and tokens per second over
``--steps`` steps after ``--warmup``, then the device time of each operator over
``--profile-steps`` steps (torch.profiler), largest first. Everything is train-draft's default
but what the flags change.

    python -m benchmarks.train_step --target /tmp/real-pair/target \
        --data /tmp/real-pair/corpus/draft_train.jsonl --out train_step.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from eagletree.app.training.draft_trainer import DraftTrainer
from eagletree.app.training.options import TrainOptions


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(args: argparse.Namespace, algorithm: str, scratch: Path) -> list[str]:
    options = TrainOptions(
        target=args.target,
        algorithm="eagle3" if algorithm == "eagle3" else "eagle",
        data=tuple(args.data),
        out=scratch / algorithm,
        max_steps=10**9,
        device=args.device,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        eval_prompts=0,
    )
    trainer = DraftTrainer(options)
    for _ in range(args.warmup):
        trainer.train_step()
    _synchronize(args.device)
    started = time.perf_counter()
    tokens = 0
    for _ in range(args.steps):
        tokens += trainer.train_step()[2]
    _synchronize(args.device)
    seconds = (time.perf_counter() - started) / args.steps
    lines = [
        f"## {algorithm}: {1e3 * seconds:.1f} ms per step, {tokens / args.steps / seconds:,.0f}"
        f" tok/s, {120 / seconds:.0f} steps in 2 minutes",
        "",
    ]
    if args.profile_steps:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if args.device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profile:
            for _ in range(args.profile_steps):
                trainer.train_step()
            _synchronize(args.device)
        sort = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
        table = profile.key_averages().table(
            sort_by=sort, row_limit=args.rows, max_name_column_width=60
        )
        lines += [f"{args.profile_steps} steps profiled:", "", "```", table, "```", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--target", type=Path, required=True)
    add("--data", type=Path, nargs="+", required=True)
    add("--out", type=Path, required=True)
    add("--algorithms", nargs="+", default=["eagle3", "eagle"], choices=["eagle", "eagle3"])
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--batch-size", type=int)
    add("--seq-len", type=int)
    add("--warmup", type=int, default=5)
    add("--steps", type=int, default=20)
    add("--profile-steps", type=int, default=3)
    add("--rows", type=int, default=30)
    args = parser.parse_args()
    lines = [f"# train-draft step ({args.device})", ""]
    with tempfile.TemporaryDirectory() as scratch:
        for algorithm in args.algorithms:
            lines += measure(args, algorithm, Path(scratch))
            print("\n".join(lines), flush=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
