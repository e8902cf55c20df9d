"""App: the draft-training loop — AdamW, cosine schedule, accumulation, checkpoints, resume.

``train_draft`` builds everything from ``TrainOptions``: the target (transformers, bf16 on
CUDA, fp32 on the CPU), the text, the head, and runs until ``max_steps`` or ``max_minutes``;
it writes the head to ``out`` in the format eagletree loads and, with evaluation prompts,
measures its acceptance through the engine on held-out text.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from eagletree.adapters.models.config import ConfigReader
from eagletree.app.training import acceptance_row
from eagletree.app.training.checkpoint import (
    draft_config,
    head_shape,
    latest_checkpoint,
    load_state,
    save_head,
    save_state,
    step_dir,
)
from eagletree.app.training.corpus import Corpus, build_corpus
from eagletree.app.training.evaluation import Evaluation, evaluate
from eagletree.app.training.head_modules import init_linear_weights
from eagletree.app.training.heads import Eagle3Head, EagleHead
from eagletree.app.training.objective import Objective
from eagletree.app.training.options import (
    TrainOptions,
    aux_layer_ids,
    check_options,
    check_positions,
)
from eagletree.app.training.progress import ProgressLine
from eagletree.app.training.target_features import HFTarget
from eagletree.app.training.vocab import VocabMap, choose_draft_vocab, token_counts, vocab_map
from eagletree.domain.errors import ConfigurationError

MIN_LR_RATIO = 0.1  # the cosine schedule ends at a tenth of the peak


@dataclass(slots=True)
class TrainReport:
    steps: int
    losses: list[float]
    accuracy: tuple[float, ...]  # the last batch's, per unrolled step
    seconds: float
    evaluation: Evaluation
    out: Path
    train_tokens: int  # the training text's length, in tokens
    tokens_seen: int  # the tokens of every batch trained on

    @property
    def acceptance(self) -> list[acceptance_row.AcceptanceRow]:
        return self.evaluation.acceptance

    @property
    def epochs(self) -> float:
        """How many times the training text was passed over: past a few, a head learns its
        windows rather than the target (held-out agreement falls behind the training
        batches')."""
        return self.tokens_seen / max(self.train_tokens, 1)


def learning_rate(options: TrainOptions, step: int, elapsed_s: float) -> float:
    """Linear warm-up, then cosine decay to MIN_LR_RATIO over the step or time budget."""
    progress = 0.0
    if options.max_steps:
        progress = max(progress, step / options.max_steps)
    if options.max_minutes:
        progress = max(progress, elapsed_s / (60 * options.max_minutes))
    warmup = min(1.0, (step + 1) / max(options.warmup_steps, 1))
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return options.lr * warmup * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * cosine)


def _save_dtype(reader: ConfigReader) -> torch.dtype:
    name = reader.raw.get("dtype") or reader.raw.get("torch_dtype") or "bfloat16"
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) else torch.bfloat16


class DraftTrainer:
    def __init__(self, options: TrainOptions, stream: TextIO | None = None) -> None:
        options = options.resolved()
        check_options(options)
        self.options = options
        self.stream = stream
        self.reader = ConfigReader.from_dir(options.target)
        check_positions(options, self.reader.get_int("max_position_embeddings", 2048))
        self.shape = head_shape(self.reader)
        self.device = torch.device(options.device)
        self.aux_layer_ids: tuple[int, ...] = ()
        if options.algorithm == "eagle3":
            num_layers = self.reader.get_int("num_hidden_layers")
            self.aux_layer_ids = aux_layer_ids(options.aux_layers, num_layers)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.target = HFTarget(options.target, dtype, self.device, self.aux_layer_ids)
        self.corpus: Corpus = build_corpus(options, self.target)
        self.vocab: VocabMap | None = None
        torch.manual_seed(options.seed)
        self.head = self._build_head()
        self.objective = Objective(
            self.head, self.target, options.unroll_steps, options.loss, self.vocab
        )
        self.optimizer = torch.optim.AdamW(
            self.head.parameters(),
            lr=options.lr,
            betas=(0.9, 0.95),
            weight_decay=options.weight_decay,
        )
        self.step = 0
        self.elapsed_s = 0.0

    def _build_head(self) -> EagleHead | Eagle3Head:
        options, shape = self.options, self.shape
        head: EagleHead | Eagle3Head
        if options.algorithm == "eagle":
            head = EagleHead(shape, options.num_layers, self.target.lm_head)
            init_linear_weights(head, std=0.02)
            return head.to(self.device)
        vocab_size = self.target.vocab_size
        size = options.draft_vocab_size or min(vocab_size, 32_000)
        counts = token_counts(self.corpus.train, vocab_size)
        self.vocab = vocab_map(choose_draft_vocab(counts, size), vocab_size)
        head = Eagle3Head(shape, len(self.aux_layer_ids), size)
        init_linear_weights(head, std=0.02)
        with torch.no_grad():  # start from the target's own output rows: a warm, not random, head
            rows = self.vocab.target_ids.to(self.target.lm_head.weight.device)
            head.lm_head.weight.copy_(self.target.lm_head.weight[rows].float())
            if options.eagle3_norm == "target":
                norm = self.target.final_norm_weight
                if norm is None:
                    raise ConfigurationError(
                        f"{options.target} has no final norm (model.norm) to start EAGLE-3's"
                        " from: start it as ones"
                    )
                head.norm.weight.copy_(norm.float())
        head.lm_head.weight.requires_grad_(options.eagle3_lm_head == "trained")
        return head.to(self.device)

    def config(self) -> dict[str, Any]:
        options = self.options
        return draft_config(
            options.algorithm,
            self.reader,
            self.shape,
            _save_dtype(self.reader),
            num_layers=options.num_layers if options.algorithm == "eagle" else 1,
            draft_vocab_size=None if self.vocab is None else self.vocab.d2t.numel(),
            aux_layer_ids=self.aux_layer_ids,
        )

    def save(self, directory: Path, with_state: bool) -> None:
        save_head(directory, self.head, self.config(), _save_dtype(self.reader), self.vocab)
        if with_state:
            state: dict[str, Any] = {
                "algorithm": self.options.algorithm,
                "step": self.step,
                "elapsed_s": self.elapsed_s,
                "head": self.head.state_dict(),
                "optimizer": self.optimizer.state_dict(),
            }
            if self.vocab is not None:
                state["d2t"], state["t2d"] = self.vocab.d2t, self.vocab.t2d
            save_state(directory, state)

    def restore(self, directory: Path) -> None:
        state = load_state(directory)
        if state["algorithm"] != self.options.algorithm:
            raise ConfigurationError(
                f"{directory} holds an {state['algorithm']} head, not {self.options.algorithm}"
            )
        if self.vocab is not None and not torch.equal(state["d2t"], self.vocab.d2t):
            raise ConfigurationError(f"{directory}: the draft vocabulary differs from this data's")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.elapsed_s = float(state["elapsed_s"])

    def _done(self) -> bool:
        options = self.options
        if options.max_steps is not None and self.step >= options.max_steps:
            return True
        return options.max_minutes is not None and self.elapsed_s >= 60 * options.max_minutes

    def train(self) -> TrainReport:
        options = self.options
        if options.resume:
            found = latest_checkpoint(options.out)
            if found is not None:
                self.restore(found)
        progress = ProgressLine(options.max_steps, self.stream, every=options.log_every)
        losses: list[float] = []
        accuracy: tuple[float, ...] = ()
        self.head.train()
        while not self._done():
            started = time.perf_counter()
            loss_sum, accuracy, num_tokens = self.train_step()
            self.elapsed_s += time.perf_counter() - started
            losses.append(loss_sum)
            progress.update(self.step, loss_sum, accuracy, num_tokens)
            if options.checkpoint_every and self.step % options.checkpoint_every == 0:
                self.save(step_dir(options.out, self.step), with_state=True)
        progress.close()
        self.head.eval()
        self.save(options.out, with_state=False)
        evaluation = self.evaluate()
        report = TrainReport(
            self.step,
            losses,
            accuracy,
            self.elapsed_s,
            evaluation,
            options.out,
            train_tokens=int(self.corpus.train.numel()),
            tokens_seen=self.step * options.grad_accum * options.batch * options.window,
        )
        _write_report(report, options)
        return report

    def train_step(self) -> tuple[float, tuple[float, ...], int]:
        """One optimizer step over ``grad_accum`` micro-batches: (loss, top-1 agreement per
        unrolled step, tokens)."""
        options = self.options
        lr = learning_rate(options, self.step, self.elapsed_s)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, num_tokens, accs = 0.0, 0, []
        for micro in range(options.grad_accum):
            batch = self.corpus.sampler.batch(self.step * options.grad_accum + micro)
            result = self.objective(batch)
            torch.autograd.backward(result.loss / options.grad_accum)
            # SYNC: the loss value for the display, once per micro-batch
            loss_sum += float(result.loss.detach()) / options.grad_accum
            num_tokens += result.num_tokens
            accs.append(result.accuracy)
        nn.utils.clip_grad_norm_(self.head.parameters(), options.grad_clip)
        self.optimizer.step()
        self.step += 1
        accuracy = tuple(sum(a) / len(a) for a in zip(*accs, strict=True))
        return loss_sum, accuracy, num_tokens

    def evaluate(self) -> Evaluation:
        draft_to_target = None if self.vocab is None else self.vocab.target_ids
        with torch.no_grad():
            return evaluate(self.options, self.head, self.target, draft_to_target, self.corpus)


def _write_report(report: TrainReport, options: TrainOptions) -> None:
    summary = {
        "options": {
            key: str(value) if isinstance(value, Path) else value
            for key, value in asdict(options).items()
            if key not in ("data", "eval_shapes")
        },
        "data": [str(p) for p in options.data],
        "steps": report.steps,
        "seconds": report.seconds,
        "train_tokens": report.train_tokens,
        "epochs": report.epochs,
        "losses": report.losses,  # this run's, one per optimizer step
        **report.evaluation.as_dict(report.accuracy),
    }
    (options.out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    if report.acceptance:
        (options.out / "acceptance.md").write_text(acceptance_row.markdown_table(report.acceptance))


def train_draft(options: TrainOptions, stream: TextIO | None = None) -> TrainReport:
    return DraftTrainer(options, stream).train()
