"""The real pair benchmark's options, and the training options they make (real_pair.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import torch

from benchmarks.real_pair.target import TargetSpec, TargetTraining
from eagletree.app.training.options import TrainOptions


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="a real target/draft pair trained here, and its acceptance through the engine"
    )
    add = parser.add_argument
    add("--out", type=Path, required=True)
    add("--report-dir", type=Path, help="where report.md and report.json go (default: --out)")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--seed", type=int, default=0)
    add("--reuse", action="store_true", help="keep what --out already holds, train the rest")
    add("--source-dir", type=Path, action="append", default=[], help="more .py roots")
    add("--corpus-mb", type=float, default=96.0, help="source text read (training + held out)")
    add("--tokenizer-mb", type=float, default=12.0, help="text the BPE tokenizer is trained on")
    add("--draft-data-mb", type=float,
        help="text the draft heads train on (default: all the target's training text)")  # fmt: skip
    add("--vocab-size", type=int, default=16384)
    add("--hidden-size", type=int, default=768)
    add("--intermediate-size", type=int, default=2048)
    add("--num-layers", type=int, default=12)
    add("--num-heads", type=int, default=12)
    add("--num-kv-heads", type=int, default=4)
    add("--seq-len", type=int, default=1024)
    add("--batch-size", type=int, default=32, help="target training batch (sequences)")
    add("--target-lr", type=float, default=1e-3)
    add("--target-minutes", type=float, default=2.2)
    add("--head-minutes", type=float, default=2.0,
        help="per head; every other training option is train-draft's default")  # fmt: skip
    add("--measure-minutes", type=float, default=1.5,
        help="acceptance, both heads; shapes past it are listed as not measured")  # fmt: skip
    add("--algorithms", nargs="+", default=["eagle", "eagle3"], choices=["eagle", "eagle3"])
    add("--eval-prompts", type=int, default=16)
    add("--fresh-contexts", type=int, default=256, help="one-step acceptance contexts (0: none)")
    add("--prompt-len", type=int, default=64)
    add("--eval-new-tokens", type=int, default=64,
        help="greedy tokens per prompt (a small target loops more the longer it runs)")  # fmt: skip
    add("--depths", type=int, nargs="+", default=[3, 5, 6, 7])
    add("--tree-sizes", type=int, nargs="+", default=[8, 32])
    add("--tree-topks", type=int, nargs="+", default=[8])
    add("--cuda-graph", choices=["auto", "on", "off"], default="off",
        help="engine setting for the acceptance runs (capture costs time per engine)")  # fmt: skip
    add("--speed-batch-sizes", type=int, nargs="*", default=[],
        help="tok/s of plain, best chain, best tree (CUDA; default none: skip)")  # fmt: skip
    add("--speed-new-tokens", type=int, default=64)
    add("--exact-dtype", choices=["float32", "none"], default="none",
        help="re-run each head's best shape in this dtype against plain decoding")  # fmt: skip
    add("--llama8b-step-ratio", type=float, nargs=2, default=[1.56, 1.38],
        metavar=("EAGLE", "EAGLE3"),
        help="tree S5 k4 N8 step ÷ plain step at bs 1, Llama-3.1-8B (benchmarks.md)")  # fmt: skip
    return parser


def target_spec(args: argparse.Namespace, vocab_size: int, eos_id: int) -> TargetSpec:
    return TargetSpec(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        max_position_embeddings=max(2048, 2 * args.seq_len),
        bos_token_id=eos_id,
        eos_token_id=eos_id,
    )


def target_training(args: argparse.Namespace) -> TargetTraining:
    return TargetTraining(
        max_steps=None,
        max_minutes=args.target_minutes,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.target_lr,
        warmup_steps=50,
        seed=args.seed,
    )


def head_options(
    args: argparse.Namespace,
    algorithm: Literal["eagle", "eagle3"],
    target_dir: Path,
    data: Path,
    out: Path | None = None,
    minutes: float | None = None,
) -> TrainOptions:
    """What `eagletree train-draft --target --algorithm --data --out --max-minutes` runs: every
    training option is its default (the pair judges the defaults); the engine's acceptance is
    measured by the table, not by train-draft."""
    return TrainOptions(
        target=target_dir,
        algorithm=algorithm,
        data=(data,),
        out=out or args.out / algorithm,
        max_steps=None,
        max_minutes=args.head_minutes if minutes is None else minutes,
        seed=args.seed,
        device=args.device,
        eval_prompts=0,
        log_every=100,
    )
