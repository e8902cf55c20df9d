"""Benchmark: a real target/draft pair trained here, and its acceptance through the engine.

No model can be downloaded, so the pipeline makes one, in one command with fixed seeds:

1. corpus: the Python source files of this machine (standard library, installed packages),
   shuffled by seed up to ``--corpus-mb``; every 20th file (by a hash of its path) is held out;
2. tokenizer: byte-level BPE (``tokenizers``) of ``--vocab-size`` trained on the training files,
   saved as ``target/tokenizer.json`` beside the weights;
3. target: transformers' ``LlamaForCausalLM`` (about 100 M parameters by default) trained from
   scratch for ``--target-minutes``;
4. heads: ``train-draft`` EAGLE and EAGLE-3 heads for ``--head-minutes`` each with
   train-draft's defaults (``--target --algorithm --data --out --max-minutes`` only);
5. acceptance (``benchmarks/real_pair/table.py``): greedy continuations of held-out prompts
   for chains S = 3, 5, 6, 7 and trees of those depths at N = 8, 32 with k = 8; one verify step
   from fresh held-out contexts and T = 1 continuations for the chains and the best tree of
   each budget; the prompt-lookup baseline; the same head's chains simulated offline
   (``chain_simulation``); optionally each head's best shape re-run in float32
   (``--exact-dtype``);
6. speed (CUDA, ``--speed-batch-sizes``, none by default): tok/s of plain, the best chain and
   the best tree of each budget.

Checkpoints land under ``--out`` (with ``corpus/held_out.jsonl`` for ``eagletree bench
--prompts``), ``report.md`` and ``report.json`` (rewritten after every phase, ending with issue
29's goals) under ``--report-dir``. The default budget fits one 570 s GPU call on an H200
(scripts/gpu.sh real-pair): corpus and tokenizer about 0.5 min, target 2.2, heads 2 × 2 plus
loading, acceptance 1.5 plus the plain references and the offline chains:

    python3 -m benchmarks.real_pair --out /tmp/real-pair
    python3 -m benchmarks.real_pair --out /tmp/rp --device cpu --corpus-mb 1 \
        --vocab-size 512 --hidden-size 64 --num-layers 3 --num-heads 4 --num-kv-heads 2 \
        --intermediate-size 128 --target-minutes 0.3 --head-minutes 0.2 --seq-len 128 \
        --batch-size 8 --eval-prompts 2 --eval-new-tokens 16 --depths 3     # CPU: does it run?
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from benchmarks.real_pair.goals import goal_shapes_first
from benchmarks.real_pair.options import head_options, parser, target_spec, target_training
from benchmarks.real_pair.report import PairReport
from benchmarks.real_pair.sources import (
    EOS,
    collect_sources,
    is_held_out,
    prefix_by_size,
    source_roots,
    train_tokenizer,
)
from benchmarks.real_pair.speed import measure_speed, speed_shapes
from benchmarks.real_pair.table import (
    TableInputs,
    lookup_table,
    measure_head,
    shape_grid,
)
from benchmarks.real_pair.target import (
    held_out_quality,
    num_parameters,
    train_target,
)
from eagletree.app.training import acceptance, acceptance_row
from eagletree.app.training.acceptance_row import AcceptanceRow
from eagletree.app.training.chain_simulation import load_trained_head, simulated_chain
from eagletree.app.training.data import FileTokenizer, prompt_windows, tokenize
from eagletree.app.training.draft_trainer import train_draft


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    report = PairReport(args.report_dir or args.out, args)
    pair = prepare_pair(args, report)
    _train_heads(args, report, pair.draft_data)
    _measure_acceptance(args, report, pair.tokenizer, pair.held_tokens)
    if args.device.startswith("cuda") and args.speed_batch_sizes and report.heads:
        _measure_speed(args, report, pair.held_tokens)
    print(report.markdown())
    return 0


Files = list[tuple[str, str]]


class PreparedPair(NamedTuple):
    tokenizer: FileTokenizer
    held_tokens: torch.Tensor  # the held-out files' tokens
    draft_data: Path  # the heads' training text, JSONL


def prepare_pair(args: argparse.Namespace, report: PairReport) -> PreparedPair:
    """Corpus, tokenizer and target (kept under ``--out`` with ``--reuse``), and the text the
    heads train on: ``corpus/draft_train.jsonl``, and ``corpus/held_out.jsonl`` (one document per
    held-out file) for ``eagletree bench --prompts``."""
    args.out.mkdir(parents=True, exist_ok=True)
    train_files, held_files = _read_corpus(args, report)
    tokenizer, train_tokens, held_tokens = _tokenize(args, report, train_files, held_files)
    _train_target(args, report, tokenizer, train_tokens, held_tokens)
    corpus = args.out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    texts = [t for _, t in train_files]
    if args.draft_data_mb is not None:
        texts = prefix_by_size(texts, args.draft_data_mb)
    _write_jsonl(corpus / "draft_train.jsonl", texts)
    _write_jsonl(corpus / "held_out.jsonl", [t for _, t in held_files])
    return PreparedPair(tokenizer, held_tokens, corpus / "draft_train.jsonl")


def _write_jsonl(path: Path, texts: Sequence[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _read_corpus(args: argparse.Namespace, report: PairReport) -> tuple[Files, Files]:
    sources = collect_sources(source_roots(args.source_dir), int(args.corpus_mb * 2**20), args.seed)
    train_files = [(p, t) for p, t in sources if not is_held_out(p)]
    held_files = [(p, t) for p, t in sources if is_held_out(p)]
    report.data["corpus"] = {
        "train_files": len(train_files),
        "held_out_files": len(held_files),
        "train_chars": sum(len(t) for _, t in train_files),
        "held_out_chars": sum(len(t) for _, t in held_files),
    }
    report.phase("corpus")
    return train_files, held_files


def _tokenize(
    args: argparse.Namespace, report: PairReport, train_files: Files, held_files: Files
) -> tuple[FileTokenizer, torch.Tensor, torch.Tensor]:
    target_dir = args.out / "target"
    if args.reuse and (target_dir / "tokenizer.json").is_file():
        tokenizer = FileTokenizer(target_dir / "tokenizer.json")
    else:
        tokenizer_texts = prefix_by_size([t for _, t in train_files], args.tokenizer_mb)
        tokenizer = train_tokenizer(tokenizer_texts, args.vocab_size, target_dir)
    eos_id = tokenizer.token_id(EOS)
    assert eos_id is not None, "the tokenizer lost its end-of-text token"
    train_tokens = tokenize([t for _, t in train_files], tokenizer, [eos_id])
    held_tokens = tokenize([t for _, t in held_files], tokenizer, [eos_id])
    report.data["tokenizer"] = {
        "vocab_size": tokenizer.vocab_size,
        "train_tokens": int(train_tokens.numel()),
    }
    report.phase("tokenizer")
    return tokenizer, train_tokens, held_tokens


def _train_target(
    args: argparse.Namespace,
    report: PairReport,
    tokenizer: FileTokenizer,
    train_tokens: torch.Tensor,
    held_tokens: torch.Tensor,
) -> None:
    target_dir = args.out / "target"
    if args.reuse and (target_dir / "training.json").is_file():
        losses = json.loads((target_dir / "training.json").read_text())["losses"]
    else:
        eos_id = tokenizer.token_id(EOS)
        assert eos_id is not None
        spec = target_spec(args, tokenizer.vocab_size, eos_id)
        training = target_training(args)
        losses = train_target(spec, train_tokens, target_dir, training, args.device)
        (target_dir / "training.json").write_text(json.dumps({"losses": losses}) + "\n")
    held_loss, held_top1 = held_out_quality(target_dir, held_tokens, args.seq_len, args.device)
    report.data["target"] = {
        "parameters": num_parameters(target_dir),
        "steps": len(losses),
        "tokens_seen": len(losses) * args.batch_size * args.seq_len,
        "final_train_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1),
        "held_out_loss": held_loss,
        "held_out_top1": held_top1,
    }
    report.phase("target")


def _train_heads(args: argparse.Namespace, report: PairReport, draft_data: Path) -> None:
    report.data["heads"] = {}
    for algorithm in args.algorithms:
        head_dir = args.out / algorithm
        if not (args.reuse and (head_dir / "training.json").is_file()):
            train_draft(head_options(args, algorithm, args.out / "target", draft_data))
        trained = json.loads((head_dir / "training.json").read_text())  # what train_draft wrote
        losses = trained["losses"][-20:]
        report.data["heads"][algorithm] = {
            "steps": trained["steps"],
            "final_loss": sum(losses) / max(len(losses), 1),
            "agreement_by_step": trained["agreement_by_step"],
            "agreement_source": trained["agreement_source"],
            "rank_profile": trained.get("rank_profile"),
            "draft_vocab_coverage": trained.get("draft_vocab_coverage"),
        }
        report.phase(f"train {algorithm}")


def _measure_acceptance(
    args: argparse.Namespace, report: PairReport, tokenizer: FileTokenizer, held: torch.Tensor
) -> None:
    target_dir, data = args.out / "target", report.data
    prompts = prompt_windows(held, args.eval_prompts, args.prompt_len)
    backend = {"cuda_graph": args.cuda_graph} if args.device.startswith("cuda") else None
    reference = acceptance.plain_outputs(
        target_dir, prompts, args.eval_new_tokens, args.device, backend
    )
    data["plain_looping_share"] = sum(map(acceptance_row.is_looping, reference)) / len(reference)
    data["sample"] = {
        "prompt": tokenizer.decode(prompts[0]),
        "continuation": tokenizer.decode(reference[0]),
    }
    # windows shifted off the evaluation prompts' starts
    contexts = prompt_windows(
        held[args.prompt_len // 2 + 1 :], args.fresh_contexts, args.prompt_len
    )
    inputs = TableInputs(
        target_dir, prompts, reference, contexts, args.eval_new_tokens, args.device, backend,
        args.seed,
    )  # fmt: skip
    report.lookup = lookup_table(inputs, args.depths)
    grid = goal_shapes_first(shape_grid(args.depths, args.tree_sizes, args.tree_topks))
    exact_reference = None
    if args.exact_dtype != "none":
        exact_reference = acceptance.plain_outputs(
            target_dir, prompts, args.eval_new_tokens, args.device, backend, args.exact_dtype
        )
    report.phase("plain references")
    data["exactness"] = {}
    for algorithm in args.algorithms:
        budget = 60 * args.measure_minutes / len(args.algorithms)
        table = measure_head(inputs, args.out / algorithm, algorithm, grid, budget)
        report.heads[algorithm] = table
        if exact_reference is not None and table.greedy:
            started = time.perf_counter()
            # the best shape again in a dtype without rounding ties: must equal plain exactly
            shape = max(table.greedy, key=lambda r: r.mean_accept_length).shape
            (row,) = acceptance.measure_acceptance(
                target_dir, args.out / algorithm, algorithm, prompts, [shape],
                args.eval_new_tokens, args.device, exact_reference, backend,
                dtype=args.exact_dtype,
            )  # fmt: skip
            data["exactness"][algorithm] = {
                "dtype": args.exact_dtype, "shape": shape.label,
                "identical": row.matches_plain, "match_rate": row.match_rate,
            }  # fmt: skip
            table.seconds[f"{args.exact_dtype} re-run"] = time.perf_counter() - started
        started = time.perf_counter()
        report.simulated[algorithm] = _simulate_chains(args, algorithm, prompts, reference)
        table.seconds["offline chains"] = time.perf_counter() - started
        report.phase(f"measure {algorithm}")


def _simulate_chains(
    args: argparse.Namespace,
    algorithm: str,
    prompts: Sequence[Sequence[int]],
    reference: Sequence[Sequence[int]],
) -> list[AcceptanceRow]:
    """The chains of ``--depths`` simulated offline with the head on the table's prompts."""
    head, target, draft_to_target = load_trained_head(
        args.out / algorithm, args.out / "target", algorithm, torch.device(args.device)
    )
    return [
        simulated_chain(head, target, draft_to_target, prompts, reference, depth)
        for depth in args.depths
    ]


def _measure_speed(args: argparse.Namespace, report: PairReport, held: torch.Tensor) -> None:
    algorithm, shapes = speed_shapes(report.heads)
    prompts = prompt_windows(
        held[args.prompt_len // 3 + 1 :], max(args.speed_batch_sizes), args.prompt_len
    )
    report.speed = measure_speed(
        args.out / "target", args.out / algorithm, algorithm, shapes, prompts,
        args.speed_batch_sizes, args.speed_new_tokens, args.device,
    )  # fmt: skip
    report.data["speed_head"] = algorithm
    report.phase("speed")


if __name__ == "__main__":
    sys.exit(main())
