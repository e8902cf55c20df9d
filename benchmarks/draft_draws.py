"""Benchmark: drafts drawn from the head (rejection sampling against it) against its top-k drafts
(target-only), chains and trees, at temperatures 0, 0.7 and 1 (at 0 the two are one), for heads
trained with hard, soft and mixed labels.

Acceptance does not depend on the device, so this runs anywhere, the CPU included: a byte-level
Llama target is trained on this machine's Python sources (torch's own, ``--corpus-mb``), then an
EAGLE head per label type (``--labels``) with train-draft's trainer (``--head-minutes`` each; the
models are kept in ``--dir`` and reused). Two measures per head and temperature:

- per unrolled depth on held-out text, teacher-forced: E p(argmax q), the chance the target takes
  the head's argmax (a chain of argmax drafts), and E Σ min(p, q), the chance it takes a draft
  drawn from the head (p, q the target's and the head's distributions at the temperature);
- through the engine: tokens per verify step of each of ``SHAPES`` on held-out prompts, with
  ``speculative.sampled_drafts`` top_k and drawn.

    python -m benchmarks.draft_draws --dir /tmp/draft-draws --out draft_draws.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.real_pair.target import TargetSpec, TargetTraining, train_target
from eagletree.app.training import acceptance, acceptance_row
from eagletree.app.training.data import ByteTokenizer, prompt_windows, tokenize
from eagletree.app.training.depth_profile import teacher_forced
from eagletree.app.training.draft_trainer import DraftTrainer
from eagletree.app.training.losses import LABELS
from eagletree.app.training.objective import LossWeights
from eagletree.app.training.options import TrainOptions

SPEC = TargetSpec(
    vocab_size=256, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
    num_kv_heads=2,
)  # fmt: skip
DEPTHS = 4  # unrolled steps measured teacher-forced (the trainer's default unroll)
SHAPES = (
    acceptance_row.TreeShape.chain(3),
    acceptance_row.TreeShape.chain(5),
    acceptance_row.TreeShape(5, 4, 16),
    acceptance_row.TreeShape(6, 8, 32),
)
WINDOW = 128


def corpus(root: Path, megabytes: float) -> Path:
    """Up to ``megabytes`` of torch's Python sources in one text file (kept in ``root``)."""
    path = root / "corpus.txt"
    if path.exists():
        return path
    files = sorted((Path(torch.__file__).parent / "_inductor").rglob("*.py"))
    parts, size = [], 0
    for file in files:
        text = file.read_text(errors="ignore")
        parts.append(text)
        size += len(text)
        if size > megabytes * 1e6:
            break
    path.write_text("".join(parts))
    return path


def target(root: Path, text: Path, minutes: float) -> Path:
    out = root / "target"
    if not (out / "config.json").exists():
        tokens = tokenize([text.read_text()], ByteTokenizer())
        training = TargetTraining(max_steps=None, max_minutes=minutes, seq_len=WINDOW, lr=3e-3)
        losses = train_target(SPEC, tokens, out, training)
        print(f"target: {len(losses)} steps, last loss {sum(losses[-20:]) / 20:.3f}", flush=True)
    return out


def head(root: Path, target_dir: Path, text: Path, labels: str, minutes: float) -> DraftTrainer:
    options = TrainOptions(
        target=target_dir, algorithm="eagle", data=(text,), out=root / f"head-{labels}",
        max_steps=None, max_minutes=minutes, device="cpu", batch_size=16, seq_len=WINDOW,
        eval_prompts=0, loss=LossWeights(labels=labels),  # type: ignore[arg-type]
    )  # fmt: skip
    trainer = DraftTrainer(options)
    state = options.out / "state"
    if state.exists():
        trainer.restore(state)
    else:
        trainer.train()
        trainer.save(state, with_state=True)
    trainer.head.eval()
    return trainer


@torch.no_grad()
def per_depth(trainer: DraftTrainer, temperature: float) -> tuple[list[float], list[float]]:
    """(E p(argmax q), E Σ min(p, q)) per unrolled depth over held-out windows."""
    held = trainer.corpus.held
    count = min(32, held.numel() // WINDOW)
    windows = held[: count * WINDOW].view(count, WINDOW)
    logits, target_logits = teacher_forced(trainer.head, trainer.target, windows, DEPTHS, False)
    p = _distribution(target_logits, temperature)
    argmax, drawn = [], []
    for depth, head_logits in enumerate(logits):  # (windows, rows, V) each
        rows = p[:, depth:]
        q = _distribution(head_logits[:, depth:], temperature)
        pick = head_logits[:, depth:].argmax(dim=-1, keepdim=True)
        argmax.append(float(rows.gather(-1, pick).mean()))
        drawn.append(float(torch.minimum(rows, q).sum(-1).mean()))
    return argmax, drawn


def _distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at ``temperature``; at 0 the argmax's one-hot (both measures are then the
    head's agreement with the target's argmax)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits.float() / temperature, dim=-1)


def engine_rows(
    target_dir: Path, head_dir: Path, prompts: list[list[int]], temperature: float, new: int
) -> dict[str, list[float]]:
    """Tokens per verify step of each of ``SHAPES``, per ``sampled_drafts``."""
    rows: dict[str, list[float]] = {}
    for mode in ("top_k", "drawn"):
        measured = acceptance.measure_acceptance(
            target_dir, head_dir, "eagle", prompts, SHAPES, new, "cpu",
            temperature=temperature, seed=1, sampled_drafts=mode,
        )  # fmt: skip
        rows[mode] = [row.mean_accept_length for row in measured]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/draft-draws"))
    parser.add_argument("--corpus-mb", type=float, default=4.0)
    parser.add_argument("--target-minutes", type=float, default=6.0)
    parser.add_argument("--head-minutes", type=float, default=4.0)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    parser.add_argument("--labels", nargs="+", choices=LABELS, default=list(LABELS))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    args.dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    text = corpus(args.dir, args.corpus_mb)
    target_dir = target(args.dir, text, args.target_minutes)
    lines = [
        "| head | T | argmax, per depth | drawn, per depth | "
        + " | ".join(f"{shape.label}: top-k / drawn" for shape in SHAPES)
        + " |",
        "|---|---|---|---|" + "---|" * len(SHAPES),
    ]
    results: dict[str, Any] = {}
    for labels in args.labels:
        trainer = head(args.dir, target_dir, text, labels, args.head_minutes)
        prompts = prompt_windows(trainer.corpus.held, args.prompts, 64)
        for temperature in args.temperatures:
            argmax, drawn = per_depth(trainer, temperature)
            engine = engine_rows(
                target_dir, trainer.options.out, prompts, temperature, args.new_tokens
            )
            results[f"{labels} T{temperature}"] = (argmax, drawn, engine)
            cells = zip(engine["top_k"], engine["drawn"], strict=True)
            lines.append(
                f"| {labels} | {temperature} | {' '.join(f'{a:.2f}' for a in argmax)} | "
                f"{' '.join(f'{d:.2f}' for d in drawn)} | "
                + " | ".join(f"{top:.2f} / {pick:.2f}" for top, pick in cells)
                + " |"
            )
            print(lines[-1], flush=True)
    lines.append(f"\n({time.perf_counter() - started:.0f} s)")
    report = "\n".join(lines)
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
