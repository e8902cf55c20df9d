"""Benchmark: a real target/draft pair trained here, and its acceptance through the engine.

No model can be downloaded, so the pipeline makes one, in one command with fixed seeds:

1. corpus: the Python source files of this machine (standard library, installed packages),
   shuffled by seed up to ``--corpus-mb``; every 20th file (by a hash of its path) is held out;
2. tokenizer: byte-level BPE (``tokenizers``) of ``--vocab-size`` trained on the training files,
   saved as ``target/tokenizer.json`` beside the weights;
3. target: transformers' ``LlamaForCausalLM`` (about 100 M parameters by default) trained from
   scratch for ``--target-minutes``;
4. heads: ``train-draft`` EAGLE and EAGLE-3 heads for ``--head-minutes`` each;
5. acceptance (``app/training/acceptance_table.py``): greedy continuations of held-out prompts
   for chains S = 3, 5, 7 and trees of those depths at N = 8, 16, 32, 64 with k = 4 and 8;
   one verify step from fresh held-out contexts and T = 1 continuations for the chains and the
   best tree of each budget; the prompt-lookup baseline; each head's best shape re-run in
   float32 against plain float32 decoding;
6. speed (CUDA): tok/s of plain, the best chain and the best tree of each budget at bs 1, 8, 32.

Checkpoints land under ``--out``, ``report.md`` and ``report.json`` (rewritten after every
phase, ending with the goals the pair is judged by) under ``--report-dir``. The default budget
fits one GPU call of under 10 minutes on an H200 (scripts/gpu.sh real-pair):

    PYTHONPATH=$PWD python3 benchmarks/real_pair.py --out /tmp/real-pair
    PYTHONPATH=$PWD python3 benchmarks/real_pair.py --out /tmp/rp --device cpu --corpus-mb 1 \
        --vocab-size 512 --hidden-size 64 --num-layers 3 --num-heads 4 --num-kv-heads 2 \
        --intermediate-size 128 --target-minutes 0.3 --head-minutes 0.2 --seq-len 128 \
        --batch-size 8 --eval-prompts 2 --eval-new-tokens 16 --depths 3     # CPU: does it run?
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch

from eagletree.app.training import acceptance
from eagletree.app.training.acceptance import AcceptanceRow, TreeShape
from eagletree.app.training.acceptance_table import (
    HeadTable,
    TableInputs,
    best_tree_per_budget,
    lookup_table,
    measure_head,
    shape_grid,
)
from eagletree.app.training.data import FileTokenizer, prompt_windows, tokenize
from eagletree.app.training.draft_trainer import TrainOptions, train_draft
from eagletree.app.training.pair_report import PairReport
from eagletree.app.training.pair_speed import measure_speed
from eagletree.app.training.source_corpus import (
    EOS,
    collect_sources,
    is_held_out,
    prefix_by_size,
    source_roots,
    train_tokenizer,
)
from eagletree.app.training.target_trainer import (
    TargetSpec,
    TargetTraining,
    held_out_quality,
    num_parameters,
    train_target,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--out", type=Path, required=True)
    add("--report-dir", type=Path, help="where report.md and report.json go (default: --out)")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--seed", type=int, default=0)
    add("--reuse", action="store_true", help="keep what --out already holds, train the rest")
    add("--source-dir", type=Path, action="append", default=[], help="more .py roots")
    add("--corpus-mb", type=float, default=48.0, help="source text read (training + held out)")
    add("--tokenizer-mb", type=float, default=12.0, help="text the BPE tokenizer is trained on")
    add("--draft-data-mb", type=float, default=16.0, help="text the draft heads train on")
    add("--vocab-size", type=int, default=16384)
    add("--hidden-size", type=int, default=768)
    add("--intermediate-size", type=int, default=2048)
    add("--num-layers", type=int, default=12)
    add("--num-heads", type=int, default=12)
    add("--num-kv-heads", type=int, default=4)
    add("--seq-len", type=int, default=1024)
    add("--batch-size", type=int, default=32, help="target training batch (sequences)")
    add("--target-lr", type=float, default=1e-3)
    add("--target-minutes", type=float, default=3.0)
    add("--head-minutes", type=float, default=1.0, help="per head")
    add("--measure-minutes", type=float, default=2.0,
        help="acceptance, both heads; shapes past it are listed as not measured")  # fmt: skip
    add("--head-batch-size", type=int, default=16)
    add("--head-lr", type=float, default=1e-3)
    add("--unroll-steps", type=int, default=3)
    add("--draft-vocab-size", type=int, default=8192, help="EAGLE-3")
    add("--algorithms", nargs="+", default=["eagle", "eagle3"], choices=["eagle", "eagle3"])
    add("--eval-prompts", type=int, default=16)
    add("--fresh-contexts", type=int, default=1024, help="one-step acceptance contexts (0: none)")
    add("--prompt-len", type=int, default=64)
    add("--eval-new-tokens", type=int, default=128)
    add("--depths", type=int, nargs="+", default=[3, 5, 7])
    add("--tree-sizes", type=int, nargs="+", default=[8, 16, 32, 64])
    add("--tree-topks", type=int, nargs="+", default=[4, 8])
    add("--cuda-graph", choices=["auto", "on", "off"], default="off",
        help="engine setting for the acceptance runs (capture costs time per engine)")  # fmt: skip
    add("--speed-batch-sizes", type=int, nargs="*", default=[1, 8, 32],
        help="tok/s of plain, best chain, best tree (CUDA only; none: skip)")  # fmt: skip
    add("--speed-new-tokens", type=int, default=64)
    add("--exact-dtype", choices=["float32", "none"], default="float32",
        help="re-run each head's best shape in this dtype against plain decoding")  # fmt: skip
    add("--llama8b-step-ratio", type=float, nargs=2, default=[1.39, 1.27],
        metavar=("EAGLE", "EAGLE3"),
        help="tree S5 k4 N8 step ÷ plain step, Llama-3.1-8B at bs 1 (eagletree bench)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    report = PairReport(args.report_dir or out, args)
    data = report.data

    sources = collect_sources(source_roots(args.source_dir), int(args.corpus_mb * 2**20), args.seed)
    train_files = [(p, t) for p, t in sources if not is_held_out(p)]
    held_files = [(p, t) for p, t in sources if is_held_out(p)]
    data["corpus"] = {
        "train_files": len(train_files),
        "held_out_files": len(held_files),
        "train_chars": sum(len(t) for _, t in train_files),
        "held_out_chars": sum(len(t) for _, t in held_files),
    }
    report.phase("corpus")

    target_dir = out / "target"
    if args.reuse and (target_dir / "tokenizer.json").is_file():
        tokenizer = FileTokenizer(target_dir / "tokenizer.json")
    else:
        tokenizer_texts = prefix_by_size([t for _, t in train_files], args.tokenizer_mb)
        tokenizer = train_tokenizer(tokenizer_texts, args.vocab_size, target_dir)
    vocab_size = tokenizer.vocab_size
    eos_id = tokenizer.token_id(EOS)
    assert eos_id is not None, "the tokenizer lost its end-of-text token"
    train_tokens = tokenize([t for _, t in train_files], tokenizer, [eos_id])
    held_tokens = tokenize([t for _, t in held_files], tokenizer, [eos_id])
    data["tokenizer"] = {"vocab_size": vocab_size, "train_tokens": int(train_tokens.numel())}
    report.phase("tokenizer")

    if args.reuse and (target_dir / "training.json").is_file():
        losses = json.loads((target_dir / "training.json").read_text())["losses"]
    else:
        losses = train_target(
            _target_spec(args, vocab_size, eos_id), train_tokens, target_dir,
            _target_training(args), args.device,
        )  # fmt: skip
        (target_dir / "training.json").write_text(json.dumps({"losses": losses}) + "\n")
    held_loss, held_top1 = held_out_quality(target_dir, held_tokens, args.seq_len, args.device)
    data["target"] = {
        "parameters": num_parameters(target_dir),
        "steps": len(losses),
        "tokens_seen": len(losses) * args.batch_size * args.seq_len,
        "final_train_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1),
        "held_out_loss": held_loss,
        "held_out_top1": held_top1,
    }
    report.phase("target")

    draft_data = out / "corpus" / "draft_train.jsonl"
    draft_data.parent.mkdir(parents=True, exist_ok=True)
    texts = prefix_by_size([t for _, t in train_files], args.draft_data_mb)
    draft_data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    data["heads"] = {}
    for algorithm in args.algorithms:
        head_dir = out / algorithm
        if not (args.reuse and (head_dir / "training.json").is_file()):
            train_draft(_head_options(args, algorithm, target_dir, draft_data, vocab_size))
        trained = json.loads((head_dir / "training.json").read_text())  # what train_draft wrote
        data["heads"][algorithm] = {
            "steps": trained["steps"],
            "final_loss": sum(trained["losses"][-20:]) / max(len(trained["losses"][-20:]), 1),
            "accuracy_by_step": trained["accuracy_by_step"],
        }
        report.phase(f"train {algorithm}")

    prompts = prompt_windows(held_tokens, args.eval_prompts, args.prompt_len)
    backend = {"cuda_graph": args.cuda_graph} if args.device.startswith("cuda") else None
    reference = acceptance.plain_outputs(
        target_dir, prompts, args.eval_new_tokens, args.device, backend
    )
    data["plain_looping_share"] = sum(map(acceptance.is_looping, reference)) / len(reference)
    data["sample"] = {
        "prompt": tokenizer.decode(prompts[0]),
        "continuation": tokenizer.decode(reference[0]),
    }
    # windows shifted off the evaluation prompts' starts
    contexts = prompt_windows(
        held_tokens[args.prompt_len // 2 + 1 :], args.fresh_contexts, args.prompt_len
    )
    inputs = TableInputs(
        target_dir, prompts, reference, contexts, args.eval_new_tokens, args.device, backend,
        args.seed,
    )  # fmt: skip
    report.lookup = lookup_table(inputs, args.depths)
    grid = shape_grid(args.depths, args.tree_sizes, args.tree_topks)
    exact_reference = None
    if args.exact_dtype != "none":
        exact_reference = acceptance.plain_outputs(
            target_dir, prompts, args.eval_new_tokens, args.device, backend, args.exact_dtype
        )
    data["exactness"] = {}
    for algorithm in args.algorithms:
        budget = 60 * args.measure_minutes / len(args.algorithms)
        table = measure_head(inputs, out / algorithm, algorithm, grid, budget)
        report.heads[algorithm] = table
        if exact_reference is not None and table.greedy:
            # the best shape again in a dtype without rounding ties: must equal plain exactly
            shape = max(table.greedy, key=lambda r: r.mean_accept_length).shape
            (row,) = acceptance.measure_acceptance(
                target_dir, out / algorithm, algorithm, prompts, [shape], args.eval_new_tokens,
                args.device, exact_reference, backend, dtype=args.exact_dtype,
            )  # fmt: skip
            data["exactness"][algorithm] = {
                "dtype": args.exact_dtype, "shape": shape.label,
                "identical": row.matches_plain, "match_rate": row.match_rate,
            }  # fmt: skip
        report.phase(f"measure {algorithm}")

    if args.device.startswith("cuda") and args.speed_batch_sizes and report.heads:
        algorithm, shapes = _speed_shapes(report.heads)
        speed_prompts = prompt_windows(
            held_tokens[args.prompt_len // 3 + 1 :], max(args.speed_batch_sizes), args.prompt_len
        )
        report.speed = measure_speed(
            target_dir, out / algorithm, algorithm, shapes, speed_prompts,
            args.speed_batch_sizes, args.speed_new_tokens, args.device,
        )  # fmt: skip
        data["speed_head"] = algorithm
        report.phase("speed")
    print(report.markdown())
    return 0


def _target_spec(args: argparse.Namespace, vocab_size: int, eos_id: int) -> TargetSpec:
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


def _target_training(args: argparse.Namespace) -> TargetTraining:
    return TargetTraining(
        max_steps=None,
        max_minutes=args.target_minutes,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.target_lr,
        warmup_steps=50,
        seed=args.seed,
    )


def _head_options(
    args: argparse.Namespace,
    algorithm: Literal["eagle", "eagle3"],
    target_dir: Path,
    data: Path,
    vocab_size: int,
) -> TrainOptions:
    return TrainOptions(
        target=target_dir,
        algorithm=algorithm,
        data=(data,),
        out=args.out / algorithm,
        max_steps=None,
        max_minutes=args.head_minutes,
        seed=args.seed,
        device=args.device,
        batch_size=args.head_batch_size,
        seq_len=args.seq_len,
        lr=args.head_lr,
        warmup_steps=50,
        unroll_steps=args.unroll_steps,
        draft_vocab_size=min(args.draft_vocab_size, vocab_size) if algorithm == "eagle3" else None,
        held_out_fraction=0.001,
        eval_prompts=0,
        log_every=100,
    )


def _speed_shapes(heads: dict[str, HeadTable]) -> tuple[str, list[TreeShape | None]]:
    """The head with the best greedy shape, and plain, its best chain and its best tree of each
    verify budget: the fastest tree is rarely the one that accepts most (a wide verify costs)."""

    def accept(rows: Sequence[AcceptanceRow]) -> float:
        return max((r.mean_accept_length for r in rows), default=0.0)

    algorithm = max(heads, key=lambda a: accept(heads[a].greedy))
    rows = heads[algorithm].greedy
    chains = [r for r in rows if r.shape.topk == 1]
    shapes: list[TreeShape | None] = [None]
    if chains:
        shapes.append(max(chains, key=lambda r: r.mean_accept_length).shape)
    shapes += [r.shape for r in best_tree_per_budget(rows).values()]
    return algorithm, shapes


if __name__ == "__main__":
    sys.exit(main())
