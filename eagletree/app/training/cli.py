"""App: the `eagletree train-draft` command — train an EAGLE or EAGLE-3 head for a target."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from eagletree.app.training.acceptance_row import TreeShape
from eagletree.app.training.data import add_data_argument
from eagletree.app.training.losses import LABELS, PRECISIONS, Labels
from eagletree.app.training.objective import LossWeights
from eagletree.app.training.options import DEVICE_DEFAULTS, TrainOptions
from eagletree.domain.errors import ConfigurationError


def _shape(text: str) -> TreeShape:
    """``S`` (a chain) or ``S,k,N``."""
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected S or S,k,N") from None
    if len(parts) == 1:
        return TreeShape.chain(parts[0])
    if len(parts) == 3:
        return TreeShape(*parts)
    raise argparse.ArgumentTypeError(f"{text!r}: expected S or S,k,N")


def _labels(text: str) -> Labels:
    for labels in LABELS:
        if text == labels:
            return labels
    raise argparse.ArgumentTypeError(f"--labels {text!r}: expected one of {', '.join(LABELS)}")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "train-draft",
        help="train an EAGLE / EAGLE-3 draft head for a target checkpoint",
        description="Train a draft head on text with target features computed online; write it"
        " to --out in the format eagletree and SGLang load; report its acceptance.",
    )
    add = parser.add_argument
    # the options' own defaults: one home for each value
    option = {f.name: f.default for f in dataclasses.fields(TrainOptions)}
    loss = {f.name: f.default for f in dataclasses.fields(LossWeights)}
    add("--target", required=True, type=Path, metavar="DIR", help="target checkpoint directory")
    add("--algorithm", required=True, choices=["eagle", "eagle3"])
    add_data_argument(parser)
    add("--out", required=True, type=Path, metavar="DIR")
    add("--max-steps", type=int, help="optimizer steps (default 1000 without --max-minutes)")
    add("--max-minutes", type=float, help="wall-clock training budget")
    add("--seed", type=int, default=option["seed"])
    add("--device", help="torch device (default: cuda if available, else cpu)")
    cuda, cpu = DEVICE_DEFAULTS["cuda"], DEVICE_DEFAULTS["cpu"]
    add("--batch-size", type=int,
        help=f"sequences per micro-batch (default: {cuda.batch_size} on CUDA,"
        f" {cpu.batch_size} on the CPU)")  # fmt: skip
    add("--seq-len", type=int,
        help=f"tokens per sequence (default: {cuda.seq_len} on CUDA, {cpu.seq_len} on the"
        " CPU)")  # fmt: skip
    add(
        "--grad-accum",
        type=int,
        default=option["grad_accum"],
        help="micro-batches per optimizer step",
    )
    add("--lr", type=float, default=option["lr"], help="AdamW peak learning rate")
    add("--weight-decay", type=float, default=option["weight_decay"])
    add("--warmup-steps", type=int, default=option["warmup_steps"])
    add("--grad-clip", type=float, default=option["grad_clip"])
    add(
        "--unroll-steps",
        type=int,
        default=option["unroll_steps"],
        help="training-time test depth (>= 1)",
    )
    add(
        "--step-decay",
        type=float,
        default=loss["step_decay"],
        help="loss weight decay^s of unrolled step s",
    )
    add("--labels", type=_labels, default=loss["labels"], metavar="|".join(LABELS),
        help="cross-entropy on the target's argmax (hard), its distribution (soft) or the mean"
        " of both (mixed)")  # fmt: skip
    add("--ce-weight", type=float, default=loss["cross_entropy"], help="cross-entropy weight")
    add("--ce-precision", choices=PRECISIONS, default=loss["ce_precision"],
        help="hard labels' log-softmax in the head's compute dtype (bfloat16 on CUDA) or over"
        " logits upcast to float32 (slower, the same within bfloat16's rounding)")  # fmt: skip
    add(
        "--regression-weight",
        type=float,
        default=loss["regression"],
        help="EAGLE-1 feature regression",
    )
    add("--alignment-weight", type=float, default=loss["alignment"],
        help="EAGLE-3: each unrolled step's output regressed onto step 0's input at the next"
        " position (the fused target states)")  # fmt: skip
    add("--num-layers", type=int, default=option["num_layers"], help="EAGLE-1 decoder layers")
    add("--draft-vocab-size", type=int, help="EAGLE-3 (default: min(vocab, 32000))")
    add(
        "--aux-layers",
        default=option["aux_layers"],
        metavar="standard|last|I,J,K",
        help="EAGLE-3's fused target features: standard = the inputs of layers 2, L/2, L-3; "
        "last = layers 2 and L/2 and the last layer's output; or layer ids (L: the output)",
    )
    add("--held-out-fraction", type=float, default=option["held_out_fraction"])
    add(
        "--checkpoint-every",
        type=int,
        default=option["checkpoint_every"],
        metavar="K",
        help="0: no checkpoints",
    )
    add("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    add(
        "--self-distill-prompts",
        type=int,
        default=option["self_distill_prompts"],
        help="train on the target's generations",
    )
    add(
        "--self-distill-tokens",
        type=int,
        default=option["self_distill_tokens"],
        help="tokens generated per prompt",
    )
    add(
        "--prompt-len",
        type=int,
        default=option["prompt_len"],
        help="self-distillation and evaluation prompts",
    )
    add(
        "--eval-prompts",
        type=int,
        default=option["eval_prompts"],
        help="held-out prompts (0: no report)",
    )
    add("--eval-new-tokens", type=int, default=option["eval_new_tokens"])
    add(
        "--eval-shape",
        type=_shape,
        action="append",
        metavar="S|S,k,N",
        help="draft shapes of the acceptance report (default: chain S=3); repeatable",
    )
    add("--log-every", type=int, default=option["log_every"])
    parser.set_defaults(run=run)
    return parser


# passes over the training text past which the summary suggests more text
MANY_PASSES = 3


def run(args: argparse.Namespace) -> int:
    import torch

    from eagletree.app.training.acceptance_row import markdown_table
    from eagletree.app.training.draft_trainer import train_draft

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.max_steps is None and args.max_minutes is None:
        args.max_steps = 1000
    options = TrainOptions(
        target=args.target,
        algorithm=args.algorithm,
        data=tuple(args.data),
        out=args.out,
        max_steps=args.max_steps,
        max_minutes=args.max_minutes,
        seed=args.seed,
        device=device,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        grad_accum=args.grad_accum,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        grad_clip=args.grad_clip,
        unroll_steps=args.unroll_steps,
        loss=LossWeights(
            cross_entropy=args.ce_weight,
            regression=args.regression_weight,
            alignment=args.alignment_weight,
            step_decay=args.step_decay,
            labels=args.labels,
            ce_precision=args.ce_precision,
        ),
        num_layers=args.num_layers,
        draft_vocab_size=args.draft_vocab_size,
        aux_layers=args.aux_layers,
        held_out_fraction=args.held_out_fraction,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        self_distill_prompts=args.self_distill_prompts,
        self_distill_tokens=args.self_distill_tokens,
        prompt_len=args.prompt_len,
        eval_prompts=args.eval_prompts,
        eval_new_tokens=args.eval_new_tokens,
        eval_shapes=tuple(args.eval_shape or [TreeShape.chain(3)]),
        log_every=args.log_every,
    )
    try:
        report = train_draft(options)
    except (ConfigurationError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(
        f"{options.algorithm} head: {report.out} ({report.steps} steps, {report.seconds:.0f} s,"
        f" {report.epochs:.1f} passes over {report.train_tokens:,} tokens of training text)"
    )
    if report.epochs > MANY_PASSES:
        print(
            f"note: past {MANY_PASSES} passes a head learns its training windows more than the"
            " target; more text (--data) would raise its held-out agreement"
        )
    if report.acceptance:
        print(markdown_table(report.acceptance), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagletree")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train-draft", *(sys.argv[1:] if argv is None else argv)])
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
