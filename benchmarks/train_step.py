"""Benchmark: where one `train-draft` optimizer step spends its time.

The step count a `--max-minutes` budget buys decides how far a head gets (docs/training.md,
"The sweep"), so the step itself is measured: ms per step and tokens per second over
``--steps`` steps after ``--warmup``, then the device time of each operator over
``--profile-steps`` steps (torch.profiler), largest first, for each algorithm and each
``--ce-precisions`` (the hard labels' log-softmax in float32 or in bfloat16). Everything is
train-draft's default but what the flags change. ``--random-target`` measures a random Llama
of the real pair's dimensions (hidden 768, 12 layers, vocabulary 16,384; a byte-level
tokenizer) instead of ``--target``: a step's time does not depend on the weights.

    python -m benchmarks.train_step --target /tmp/real-pair/target \
        --data /tmp/real-pair/corpus/draft_train.jsonl --out train_step.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import ModelSizes
from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer
from eagletree.app.training.draft_trainer import DraftTrainer
from eagletree.app.training.losses import PRECISIONS, Precision
from eagletree.app.training.objective import LossWeights
from eagletree.app.training.options import TrainOptions

# the real pair's target (benchmarks/real_pair/options.py)
REAL_PAIR_SIZES = ModelSizes(
    vocab_size=16384,
    hidden_size=768,
    intermediate_size=2048,
    num_layers=12,
    num_heads=12,
    num_kv_heads=4,
    head_dim=64,
    max_position_embeddings=2048,
)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_target(scratch: Path) -> Path:
    target, _ = write_random_checkpoint(scratch / "random", "llama", None, sizes=REAL_PAIR_SIZES)
    write_byte_level_tokenizer(target, REAL_PAIR_SIZES.vocab_size)
    return target


def measure(
    args: argparse.Namespace, target: Path, algorithm: str, precision: Precision, scratch: Path
) -> list[str]:
    options = TrainOptions(
        target=target,
        algorithm="eagle3" if algorithm == "eagle3" else "eagle",
        data=tuple(args.data),
        out=scratch / algorithm,
        max_steps=10**9,
        device=args.device,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        eval_prompts=0,
        loss=LossWeights(ce_precision=precision),
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
        f"## {algorithm}, log-softmax in {precision}: {1e3 * seconds:.1f} ms per step,"
        f" {tokens / args.steps / seconds:,.0f} tok/s, {120 / seconds:.0f} steps in 2 minutes",
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", type=Path)
    source.add_argument("--random-target", action="store_true")
    add("--data", type=Path, nargs="+", required=True)
    add("--out", type=Path, required=True)
    add("--algorithms", nargs="+", default=["eagle3", "eagle"], choices=["eagle", "eagle3"])
    add("--ce-precisions", nargs="+", default=["float32"], choices=PRECISIONS)
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--batch-size", type=int)
    add("--seq-len", type=int)
    add("--warmup", type=int, default=5)
    add("--steps", type=int, default=20)
    add("--profile-steps", type=int, default=3)
    add("--rows", type=int, default=30)
    args = parser.parse_args(argv)
    lines = [f"# train-draft step ({args.device})", ""]
    with tempfile.TemporaryDirectory() as scratch:
        target = random_target(Path(scratch)) if args.random_target else args.target
        for algorithm in args.algorithms:
            for precision in args.ce_precisions:
                lines += measure(args, target, algorithm, precision, Path(scratch))
                print("\n".join(lines[-2:]), flush=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
