"""Benchmark: train-draft variants on the real pair, each trained for the same short time.

On a real pair's ``--out`` (its target and ``corpus/draft_train.jsonl``; what is missing is made
by the real pair's own functions, ``prepare_pair`` with ``--reuse``) every variant is a head
trained by train-draft with its defaults except the variant's changes, for ``--minutes``; each
is reported with its teacher-forced top-1 agreement per unrolled step (held-out, as train-draft
writes it), how often a T = 1 sample of the target is the draft's top token per depth (its
sampled rank profile: a chain's acceptance at T = 1) and its chains S = ``--depths`` simulated
offline on held-out prompts against the target's greedy continuations (``chain_simulation``;
no engine runs, so variants cost their training time and a few seconds). ``sweep.md`` /
``sweep.json`` under ``--report-dir`` are rewritten after each variant.

A variant is ``ALGORITHM[:FIELD=VALUE[,FIELD=VALUE...]]``, FIELD one of ``VARIANT_FIELDS``:

    python3 -m benchmarks.real_pair.sweep --out /tmp/real-pair --variants eagle3 \
        eagle3:labels=soft eagle3:lr=3e-3,batch=32 eagle:regression=1.0
    python3 -m benchmarks.real_pair.sweep --out /tmp/rp --device cpu --minutes 0.05 \
        --variants eagle3 eagle:regression=1.0 --eval-prompts 2 --eval-new-tokens 16 \
        --corpus-mb 1 --vocab-size 512 --hidden-size 64 --num-layers 3 --num-heads 4 \
        --num-kv-heads 2 --intermediate-size 128 --target-minutes 0.3 --seq-len 128 \
        --batch-size 8                                      # CPU, on the real pair's smoke

Budget: the default 11 variants × 0.5 min plus loading and simulation take about 7 minutes
with the target present; training the target first adds about 3 (one 570 s GPU call:
scripts/gpu.sh sweep, which reuses /tmp/real-pair).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from benchmarks.real_pair.__main__ import prepare_pair
from benchmarks.real_pair.options import head_options
from benchmarks.real_pair.options import parser as pair_parser
from benchmarks.real_pair.report import PairReport
from eagletree.app.training import acceptance
from eagletree.app.training.chain_simulation import load_trained_head, simulated_chain
from eagletree.app.training.data import prompt_windows
from eagletree.app.training.draft_trainer import train_draft
from eagletree.app.training.losses import LABELS, PRECISIONS
from eagletree.app.training.options import TrainOptions


def _choice(field: str, *choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{field}={text!r}: expected one of {', '.join(choices)}")
        return text

    return parse


# variant field -> (TrainOptions field, "loss." for LossWeights' fields; parser of the value)
VARIANT_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "labels": ("loss.labels", _choice("labels", *LABELS)),
    "lr": ("lr", float),
    "batch": ("batch_size", int),
    "seq_len": ("seq_len", int),
    "unroll": ("unroll_steps", int),
    "warmup": ("warmup_steps", int),
    "regression": ("loss.regression", float),
    "alignment": ("loss.alignment", float),
    "ce": ("loss.cross_entropy", float),
    "step_decay": ("loss.step_decay", float),
    "draft_vocab": ("draft_vocab_size", int),
    "aux": ("aux_layers", str),
    "norm": ("eagle3_norm", _choice("norm", "ones", "target")),
    "lm_head": ("eagle3_lm_head", _choice("lm_head", "trained", "frozen")),
    "ce_precision": ("loss.ce_precision", _choice("ce_precision", *PRECISIONS)),
}
# one change at a time around the defaults (hard labels, lr 1e-3, batch 64, unroll 4,
# EAGLE-1 regression 0.2), mostly EAGLE-3's
DEFAULT_VARIANTS = (
    "eagle3", "eagle", "eagle3:labels=soft", "eagle3:labels=mixed", "eagle3:lr=3e-4",
    "eagle3:lr=3e-3", "eagle3:batch=16", "eagle3:unroll=3", "eagle3:unroll=6",
    "eagle:regression=0", "eagle:regression=1.0",
)  # fmt: skip


class Variant(NamedTuple):
    algorithm: str
    changes: tuple[tuple[str, Any], ...]  # (TrainOptions field path, parsed value)
    name: str

    def apply(self, options: TrainOptions) -> TrainOptions:
        for field, value in self.changes:
            if field.startswith("loss."):
                loss = replace(options.loss, **{field.removeprefix("loss."): value})
                options = replace(options, loss=loss)
            else:
                options = replace(options, **{field: value})
        return options


def parse_variant(text: str) -> Variant:
    """``ALGORITHM[:FIELD=VALUE,...]``; a ValueError names what is wrong."""
    algorithm, _, rest = text.partition(":")
    if algorithm not in ("eagle", "eagle3"):
        raise ValueError(f"variant {text!r}: the algorithm must be eagle or eagle3")
    changes = []
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals or key not in VARIANT_FIELDS:
            raise ValueError(
                f"variant {text!r}: {item!r} is not FIELD=VALUE with FIELD one of"
                f" {', '.join(VARIANT_FIELDS)}"
            )
        field, parse = VARIANT_FIELDS[key]
        try:
            changes.append((field, parse(value)))
        except ValueError as error:
            raise ValueError(f"variant {text!r}: {key}={value!r}: {error}") from None
    return Variant(algorithm, tuple(changes), text)


def _variant(text: str) -> Variant:
    try:
        return parse_variant(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="train-draft variants on the real pair",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--out", type=Path, required=True, help="a real pair's --out (made if missing)")
    add("--report-dir", type=Path, help="sweep.md and sweep.json (default: --out/sweep)")
    add("--minutes", type=float, default=0.5, help="training time of each variant")
    defaults = [parse_variant(v) for v in DEFAULT_VARIANTS]
    add("--variants", type=_variant, nargs="+", default=defaults, metavar="VARIANT")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--seed", type=int, default=0)
    add("--eval-prompts", type=int, default=16)
    add("--prompt-len", type=int, default=64)
    add("--eval-new-tokens", type=int, default=64)
    add("--depths", type=int, nargs="+", default=[3, 5, 7])
    # what it passes on, named in --help (argparse has no public list of a parser's flags)
    own = {flag for action in parser._actions for flag in action.option_strings} | {"--reuse"}
    passed_on = [
        flag
        for action in pair_parser()._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag not in own
    ]
    parser.epilog = textwrap.fill(
        "Options it does not know go to the real pair's parser (python -m benchmarks.real_pair"
        f" --help): {' '.join(passed_on)}",
        break_on_hyphens=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Options the sweep does not know go to the real pair's parser (a pair made here: its
    sizes; a reused one: its corpus, which must be the same to find the same held-out text)."""
    args, pair_argv = parser().parse_known_args(argv)
    report_dir = args.report_dir or args.out / "sweep"
    pair_args = pair_parser().parse_args(
        ["--out", str(args.out), "--reuse", "--device", args.device, "--seed", str(args.seed),
         *pair_argv]
    )  # fmt: skip
    pair = prepare_pair(pair_args, PairReport(report_dir / "pair", pair_args))
    target = args.out / "target"
    prompts = prompt_windows(pair.held_tokens, args.eval_prompts, args.prompt_len)
    reference = acceptance.plain_outputs(target, prompts, args.eval_new_tokens, args.device)
    results: list[dict[str, Any]] = []
    for index, variant in enumerate(args.variants):
        started = time.perf_counter()
        head_dir = args.out / "sweep" / f"{index:02d}-{variant.algorithm}"
        options = head_options(
            pair_args, variant.algorithm, target, pair.draft_data, head_dir, args.minutes
        )
        options = variant.apply(options)
        train_draft(options)
        trained = json.loads((head_dir / "training.json").read_text())
        head, hf_target, draft_to_target = load_trained_head(
            head_dir, target, variant.algorithm, torch.device(args.device)
        )
        chains = {
            depth: simulated_chain(
                head, hf_target, draft_to_target, prompts, reference, depth
            ).mean_accept_length
            for depth in args.depths
        }
        results.append(
            {
                "variant": variant.name,
                "options": trained["options"],
                "steps": trained["steps"],
                "agreement_by_step": trained["agreement_by_step"],
                "sampled_rank0_by_depth": [row[0] for row in trained["rank_profile"]["sampled"]],
                "sampled_top4_by_depth": [
                    sum(row[:4]) for row in trained["rank_profile"]["sampled"]
                ],
                "drawn_by_depth": [row[0] for row in trained["rank_profile"]["drawn"]],
                "chain_tokens_per_step": chains,
                "seconds": time.perf_counter() - started,
            }
        )
        write_report(report_dir, args, results)
    print((report_dir / "sweep.md").read_text())
    return 0


def write_report(report_dir: Path, args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    summary = {"minutes": args.minutes, "depths": args.depths, "variants": results}
    (report_dir / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    chains = " | ".join(f"chain S{d}" for d in args.depths)
    lines = [
        f"# train-draft variants, {args.minutes:g} min each",
        "",
        "Agreement: teacher-forced top-1 per unrolled step on held-out text; T 1: how often a"
        " sample of the target at T = 1 is the draft's top token, by depth (train-draft's"
        " sampled rank profile: an argmax chain's acceptance at T = 1); T 1 top 4: how often it"
        " is among the draft's 4 best (a k = 4 tree's acceptance at a node); T 1 drawn: Σ min(p,"
        " q) by depth (the first draw of a node whose drafts are drawn, the engine's default at"
        " T > 0); chains: tokens per step simulated offline on held-out prompts (greedy).",
        "",
        f"| variant | steps | agreement by step | T 1 | T 1 top 4 | T 1 drawn | {chains} |",
        "|---|---|---|---|---|---|" + "---|" * len(args.depths),
    ]
    for result in results:
        agreement = " ".join(f"{a:.2f}" for a in result["agreement_by_step"])
        sampled = " ".join(f"{a:.2f}" for a in result["sampled_rank0_by_depth"])
        top4 = " ".join(f"{a:.2f}" for a in result["sampled_top4_by_depth"])
        drawn = " ".join(f"{a:.2f}" for a in result["drawn_by_depth"])
        tokens = " | ".join(f"{v:.2f}" for v in result["chain_tokens_per_step"].values())
        lines.append(
            f"| {result['variant']} | {result['steps']} | {agreement} | {sampled} | {top4}"
            f" | {drawn} | {tokens} |"
        )
    (report_dir / "sweep.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
