"""Benchmark: a real target/draft pair trained here, and its acceptance through the engine.

No model can be downloaded, so the pipeline makes one, in one command with fixed seeds:

1. corpus: the Python source files of this machine (standard library, installed packages),
   shuffled by seed up to ``--corpus-mb``; every 20th file (by a hash of its path) is held out;
2. tokenizer: byte-level BPE (``tokenizers``) of ``--vocab-size`` trained on the training files,
   saved as ``target/tokenizer.json`` beside the weights;
3. target: transformers' ``LlamaForCausalLM`` (about 110 M parameters by default) trained from
   scratch for ``--target-minutes``;
4. heads: ``train-draft`` EAGLE and EAGLE-3 heads for ``--head-minutes`` each;
5. acceptance: greedy generation through the engine on held-out prompts for chains S = 3, 5, 7
   and trees of the same depths at N = 8, 16, 32, 64 (k = ``--tree-topk``): mean acceptance
   length, acceptance per depth, whether the output equals plain decoding, the share of
   looping continuations.

Everything lands under ``--out``: checkpoints, ``report.md`` and ``report.json``. The default
budget fits one GPU call of under 9 minutes on an H200 (scripts/gpu.sh real-pair):

    PYTHONPATH=$PWD python3 benchmarks/real_pair.py --out /tmp/real-pair
    PYTHONPATH=$PWD python3 benchmarks/real_pair.py --out /tmp/rp --device cpu --corpus-mb 1 \
        --vocab-size 512 --hidden-size 64 --num-layers 3 --num-heads 4 --num-kv-heads 2 \
        --intermediate-size 128 --target-minutes 0.3 --head-minutes 0.2 --seq-len 128 \
        --batch-size 8 --eval-prompts 2 --eval-new-tokens 16 --depths 3     # CPU: does it run?
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eagletree.app.training import acceptance
from eagletree.app.training.acceptance import AcceptanceRow, TreeShape
from eagletree.app.training.data import FileTokenizer, prompt_windows, tokenize
from eagletree.app.training.draft_trainer import TrainOptions, train_draft
from eagletree.app.training.target_trainer import TargetSpec, TargetTraining, train_target

EOS = "<|endoftext|>"
HELD_OUT_EVERY = 20
MAX_FILE_BYTES = 1 << 20  # larger .py files are generated tables, not code


def source_roots(extra: Sequence[Path]) -> list[Path]:
    paths = sysconfig.get_paths()
    roots = {Path(paths[key]) for key in ("stdlib", "purelib", "platlib") if key in paths}
    roots.update(extra)
    return sorted(r for r in roots if r.is_dir())


def collect_sources(roots: Sequence[Path], max_bytes: int, seed: int) -> list[tuple[str, str]]:
    """(path, text) of .py files, shuffled by ``seed``, until ``max_bytes`` of text."""
    files = sorted({p.resolve() for root in roots for p in root.rglob("*.py") if p.is_file()})
    random.Random(seed).shuffle(files)
    chosen: list[tuple[str, str]] = []
    total = 0
    for file in files:
        try:
            if file.stat().st_size > MAX_FILE_BYTES:
                continue
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text.strip():
            continue
        chosen.append((str(file), text))
        total += len(text)
        if total >= max_bytes:
            break
    return chosen


def is_held_out(path: str) -> bool:
    return int(hashlib.sha1(path.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def train_tokenizer(texts: Sequence[str], vocab_size: int, out_dir: Path) -> FileTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    return FileTokenizer(out_dir / "tokenizer.json")


def tree_shapes(depths: Sequence[int], sizes: Sequence[int], topk: int) -> list[TreeShape]:
    """Chains first, then trees by depth: a tight time budget cuts the deepest trees first."""
    chains = [TreeShape.chain(depth) for depth in depths]
    return chains + [TreeShape(depth, topk, n) for depth in depths for n in sizes]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--out", type=Path, required=True)
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--seed", type=int, default=0)
    add("--source-dir", type=Path, action="append", default=[], help="more .py roots")
    add("--corpus-mb", type=float, default=64.0, help="source text read (training + held out)")
    add("--tokenizer-mb", type=float, default=16.0, help="text the BPE tokenizer is trained on")
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
    add("--target-minutes", type=float, default=3.5)
    add("--head-minutes", type=float, default=1.25, help="per head")
    add("--measure-minutes", type=float, default=1.0,
        help="both heads together; shapes past the budget are left out of the report")  # fmt: skip
    add("--head-batch-size", type=int, default=16)
    add("--head-lr", type=float, default=1e-3)
    add("--unroll-steps", type=int, default=3)
    add("--draft-vocab-size", type=int, default=8192, help="EAGLE-3")
    add("--algorithms", nargs="+", default=["eagle", "eagle3"], choices=["eagle", "eagle3"])
    add("--eval-prompts", type=int, default=16)
    add("--prompt-len", type=int, default=64)
    add("--eval-new-tokens", type=int, default=128)
    add("--depths", type=int, nargs="+", default=[3, 5, 7])
    add("--tree-sizes", type=int, nargs="+", default=[8, 16, 32, 64])
    add("--tree-topk", type=int, default=8)
    add("--cuda-graph", choices=["auto", "on", "off"], default="off",
        help="engine setting for the measurement (capture costs time per engine)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    started = time.perf_counter()

    def phase(name: str) -> None:
        now = time.perf_counter()
        timings[name] = now - started - sum(timings.values())
        print(f"[{name}] {timings[name]:.1f} s", file=sys.stderr, flush=True)

    sources = collect_sources(source_roots(args.source_dir), int(args.corpus_mb * 2**20), args.seed)
    train_files = [(p, t) for p, t in sources if not is_held_out(p)]
    held_files = [(p, t) for p, t in sources if is_held_out(p)]
    report["corpus"] = {
        "train_files": len(train_files),
        "held_out_files": len(held_files),
        "train_chars": sum(len(t) for _, t in train_files),
        "held_out_chars": sum(len(t) for _, t in held_files),
    }
    phase("corpus")

    target_dir = out / "target"
    tokenizer_texts = _prefix_by_size([t for _, t in train_files], args.tokenizer_mb)
    tokenizer = train_tokenizer(tokenizer_texts, args.vocab_size, target_dir)
    vocab_size = tokenizer.vocab_size
    eos_id = tokenizer.token_id(EOS)
    assert eos_id is not None, "the tokenizer lost its end-of-text token"
    train_tokens = tokenize([t for _, t in train_files], tokenizer, [eos_id])
    held_tokens = tokenize([t for _, t in held_files], tokenizer, [eos_id])
    report["tokenizer"] = {"vocab_size": vocab_size, "train_tokens": int(train_tokens.numel())}
    phase("tokenizer")

    spec = TargetSpec(
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
    training = TargetTraining(
        max_steps=None,
        max_minutes=args.target_minutes,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.target_lr,
        warmup_steps=50,
        seed=args.seed,
    )
    losses = train_target(spec, train_tokens, target_dir, training, args.device)
    held_loss = _held_out_loss(target_dir, held_tokens, args.seq_len, args.device)
    report["target"] = {
        "parameters": _num_parameters(target_dir),
        "steps": len(losses),
        "tokens_seen": len(losses) * args.batch_size * args.seq_len,
        "final_train_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1),
        "held_out_loss": held_loss,
    }
    phase("target")

    draft_data = out / "corpus" / "draft_train.jsonl"
    draft_data.parent.mkdir(parents=True, exist_ok=True)
    texts = _prefix_by_size([t for _, t in train_files], args.draft_data_mb)
    draft_data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    prompts = prompt_windows(held_tokens, args.eval_prompts, args.prompt_len)
    backend = {"cuda_graph": args.cuda_graph} if args.device.startswith("cuda") else None
    reference = acceptance.plain_outputs(
        target_dir, prompts, args.eval_new_tokens, args.device, backend
    )
    report["plain_looping_share"] = sum(map(acceptance.is_looping, reference)) / len(reference)
    shapes = tree_shapes(args.depths, args.tree_sizes, args.tree_topk)
    report["heads"] = {}
    tables: dict[str, list[AcceptanceRow]] = {}
    for algorithm in args.algorithms:
        options = TrainOptions(
            target=target_dir,
            algorithm=algorithm,
            data=(draft_data,),
            out=out / algorithm,
            max_steps=None,
            max_minutes=args.head_minutes,
            seed=args.seed,
            device=args.device,
            batch_size=args.head_batch_size,
            seq_len=args.seq_len,
            lr=args.head_lr,
            warmup_steps=50,
            unroll_steps=args.unroll_steps,
            draft_vocab_size=min(args.draft_vocab_size, vocab_size)
            if algorithm == "eagle3"
            else None,
            held_out_fraction=0.001,
            eval_prompts=0,
            log_every=100,
        )
        trained = train_draft(options)
        phase(f"train {algorithm}")
        rows = acceptance.measure_acceptance(
            target_dir,
            options.out,
            algorithm,
            prompts,
            shapes,
            args.eval_new_tokens,
            args.device,
            reference,
            backend,
            time_budget_s=60 * args.measure_minutes / len(args.algorithms),
        )
        tables[algorithm] = rows
        report["heads"][algorithm] = {
            "steps": trained.steps,
            "final_loss": sum(trained.losses[-20:]) / max(len(trained.losses[-20:]), 1),
            "accuracy_by_step": list(trained.accuracy),
            "acceptance": [row.as_dict() for row in rows],
            "not_measured": [shape.label for shape in shapes[len(rows) :]],
        }
        phase(f"measure {algorithm}")
    report["seconds"] = timings
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(_markdown(report, tables))
    print(_markdown(report, tables))
    return 0


def _prefix_by_size(texts: Sequence[str], megabytes: float) -> list[str]:
    chosen, total = [], 0
    for text in texts:
        if total >= megabytes * 2**20:
            break
        chosen.append(text)
        total += len(text)
    return chosen


def _num_parameters(target_dir: Path) -> int:
    from safetensors import safe_open

    count = 0
    for file in target_dir.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                count += _numel(handle, name)
    return count


def _numel(handle: Any, name: str) -> int:
    shape = handle.get_slice(name).get_shape()
    size = 1
    for dim in shape:
        size *= int(dim)
    return size


@torch.no_grad()
def _held_out_loss(target_dir: Path, tokens: torch.Tensor, seq_len: int, device: str) -> float:
    """Mean next-token cross-entropy of the target on up to 32 held-out windows."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    model = model.to(device).eval()
    windows = tokens[: (tokens.numel() // seq_len) * seq_len].view(-1, seq_len)[:32].to(device)
    if windows.numel() == 0:
        return float("nan")
    logits = model(input_ids=windows).logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)
    )
    return float(loss)


def _markdown(report: dict[str, Any], tables: dict[str, list[AcceptanceRow]]) -> str:
    target = report["target"]
    lines = [
        "# Real pair: a Python-source Llama target and its trained draft heads",
        "",
        f"- corpus: {report['corpus']['train_files']} training files"
        f" ({report['corpus']['train_chars'] / 2**20:.1f} MiB),"
        f" {report['corpus']['held_out_files']} held out",
        f"- tokenizer: byte-level BPE, {report['tokenizer']['vocab_size']} tokens;"
        f" {report['tokenizer']['train_tokens']:,} training tokens",
        f"- target: {target['parameters'] / 1e6:.1f} M parameters, {target['steps']} steps"
        f" ({target['tokens_seen'] / 1e6:.1f} M tokens),"
        f" train loss {target['final_train_loss']:.3f},"
        f" held-out loss {target['held_out_loss']:.3f}",
        f"- plain greedy continuations that loop: {report['plain_looping_share']:.0%}",
        "- time: " + ", ".join(f"{k} {v:.0f} s" for k, v in report["seconds"].items()),
        "",
    ]
    for algorithm, rows in tables.items():
        head = report["heads"][algorithm]
        accuracy = " ".join(f"{a:.2f}" for a in head["accuracy_by_step"])
        lines += [
            f"## {algorithm}: {head['steps']} steps, loss {head['final_loss']:.3f},"
            f" top-1 agreement by unrolled step {accuracy}",
            "",
            acceptance.markdown_table(rows),
        ]
        if head["not_measured"]:
            lines += [f"Not measured (time budget): {', '.join(head['not_measured'])}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
