"""App: the token streams one training run reads — training windows, held-out prompts, and
(optionally) the target's own greedy continuations of training prompts (self-distillation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from eagletree.adapters.text.documents import read_documents
from eagletree.app.training.data import (
    FileTokenizer,
    WindowSampler,
    load_tokenizer,
    prompt_windows,
    split_documents,
    tokenize,
)
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.app.training.options import TrainOptions
    from eagletree.app.training.target_features import HFTarget

GENERATION_BATCH = 16


class Corpus(NamedTuple):
    train: torch.Tensor  # (num_tokens,) int64, what the windows are cut from
    sampler: WindowSampler
    eval_prompts: list[list[int]]  # held-out prompts for the acceptance report
    held: torch.Tensor  # (num_tokens,) int64, the held-out documents' tokens


def self_distilled(target: HFTarget, prompts: list[list[int]], num_tokens: int) -> torch.Tensor:
    """(num_prompts · (prompt_len + num_tokens),) the prompts with the target's continuations."""
    pieces = []
    for start in range(0, len(prompts), GENERATION_BATCH):
        batch = torch.tensor(prompts[start : start + GENERATION_BATCH], dtype=torch.int64)
        pieces.append(target.generate(batch, num_tokens).cpu().reshape(-1))
    return torch.cat(pieces)


def build_corpus(options: TrainOptions, target: HFTarget) -> Corpus:
    vocab_size = target.vocab_size
    tokenizer = load_tokenizer(options.target, vocab_size)
    eos = target.model.config.eos_token_id
    separator = [eos] if isinstance(tokenizer, FileTokenizer) and isinstance(eos, int) else []
    documents = read_documents(options.data)
    train_docs, held_docs = split_documents(documents, options.held_out_fraction, options.seed)
    train = tokenize(train_docs, tokenizer, separator)
    held = tokenize(held_docs, tokenizer, separator)
    if train.numel() and int(train.max()) >= vocab_size:
        raise ConfigurationError(
            f"the tokenizer produced id {int(train.max())}, outside the target's vocabulary"
            f" of {vocab_size}"
        )
    if options.self_distill_tokens > 0 and options.self_distill_prompts > 0:
        prompts = prompt_windows(train, options.self_distill_prompts, options.prompt_len)
        train = self_distilled(target, prompts, options.self_distill_tokens)
    sampler = WindowSampler(train, options.window, options.batch, options.seed)
    eval_prompts = prompt_windows(held, options.eval_prompts, options.prompt_len)
    return Corpus(train, sampler, eval_prompts, held)
