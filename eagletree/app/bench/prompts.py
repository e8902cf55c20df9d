"""Application: the prompts `eagletree bench` submits — random token ids, or windows of the
documents ``--prompts`` names, tokenised by the target's tokenizer (the one the engine encodes
text with, BOS included where it adds one: a window at a document's start begins with it).

Both are a function of (``--seed``, number of prompts), so every configuration gets the same
prompts at one batch size. A document prompt is ``--prompt-len`` consecutive tokens of one
document: a batch takes one window of each of as many distinct documents when enough are long
enough, else non-overlapping windows, one per document in turn.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from eagletree.app.bench.options import PROMPT_FORMATS
from eagletree.domain.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class BenchPrompts:
    """The prompts of one run: windows of ``documents`` (each (num_tokens,) int64, at least
    ``prompt_len`` long), or random ids when there are none."""

    prompt_len: int
    seed: int
    documents: tuple[torch.Tensor, ...] = ()

    @property
    def num_windows(self) -> int:
        """Non-overlapping windows of the documents: the most prompts one batch can take."""
        return sum(len(d) // self.prompt_len for d in self.documents)

    def batch(self, count: int, vocab_size: int, draw: int = 0) -> list[list[int]]:
        """``count`` distinct prompts of ``prompt_len`` tokens, the same for the same count and
        ``draw`` (another draw: another choice of windows)."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + count + 7_919 * draw)
        if not self.documents:
            ids = torch.randint(0, vocab_size, (count, self.prompt_len), generator=generator)
            prompts: list[list[int]] = ids.tolist()
            return prompts
        if count > self.num_windows:
            raise ConfigurationError(
                f"the --prompts documents hold {self.num_windows} non-overlapping windows of "
                f"--prompt-len {self.prompt_len} tokens, fewer than the {count} requests of one "
                "batch: give more text, a smaller --prompt-len or smaller --batch-sizes"
            )
        order = torch.randperm(len(self.documents), generator=generator).tolist()
        if count <= len(order):  # one window of each of `count` documents, anywhere in it
            return [self._window(d, generator) for d in order[:count]]
        return self._round_robin(order, count, generator)

    def _window(self, document: int, generator: torch.Generator) -> list[int]:
        tokens = self.documents[document]
        start = int(torch.randint(0, len(tokens) - self.prompt_len + 1, (1,), generator=generator))
        window: list[int] = tokens[start : start + self.prompt_len].tolist()
        return window

    def _round_robin(
        self, order: list[int], count: int, generator: torch.Generator
    ) -> list[list[int]]:
        """Non-overlapping windows (a seeded offset and order within each document), the
        documents' first windows first, then their second ones, … until ``count``."""
        length = self.prompt_len
        per_document = []
        for d in order:
            tokens = self.documents[d]
            num = len(tokens) // length
            spare = len(tokens) - num * length
            offset = int(torch.randint(0, spare + 1, (1,), generator=generator))
            shuffled = torch.randperm(num, generator=generator).tolist()
            per_document.append([(d, offset + i * length) for i in shuffled])
        chosen: list[tuple[int, int]] = []
        for turn in range(max(map(len, per_document))):
            chosen += [starts[turn] for starts in per_document if turn < len(starts)]
        return [self.documents[d][s : s + length].tolist() for d, s in chosen[:count]]


def bench_prompts(
    args: argparse.Namespace, target: Path, notify: Callable[[str], None]
) -> BenchPrompts:
    """The run's prompts: random without ``--prompts``; else the documents of ``--prompts``
    tokenised by ``target``'s tokenizer, checked to give the largest batch distinct prompts."""
    if not args.prompts:
        return BenchPrompts(args.prompt_len, args.seed)
    from eagletree.adapters.models.config import ConfigReader
    from eagletree.adapters.text.documents import path_documents
    from eagletree.adapters.text.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(target)  # the engine's: prompts are what generate would encode
    if tokenizer is None:
        raise ConfigurationError(
            f"--prompts needs the target's tokenizer to cut text into token prompts, and {target} "
            "has none (tokenizer.json or tokenizer.model beside config.json): put it there, or "
            "leave --prompts out for random prompts"
        )
    vocab_size = ConfigReader.from_dir(target).get_int("vocab_size")
    encoded: list[torch.Tensor] = []
    for path in args.prompts:
        texts = path_documents(Path(path))
        if not texts:
            raise ConfigurationError(f"--prompts {path} holds no text: give {PROMPT_FORMATS}")
        encoded += [torch.tensor(tokenizer.encode(t), dtype=torch.int64) for t in texts]
    outside = [int(d.max()) for d in encoded if len(d) and int(d.max()) >= vocab_size]
    if outside:
        raise ConfigurationError(
            f"the tokenizer of {target} gave id {outside[0]}, outside the target's vocabulary "
            f"of {vocab_size}: the tokenizer is not the target's"
        )
    long_enough = tuple(d for d in encoded if len(d) >= args.prompt_len)
    files = " ".join(map(str, args.prompts))
    if not long_enough:
        longest = max(map(len, encoded))
        raise ConfigurationError(
            f"no document of --prompts {files} has --prompt-len {args.prompt_len} tokens (the "
            f"longest has {longest}): give longer documents or a smaller --prompt-len"
        )
    prompts = BenchPrompts(args.prompt_len, args.seed, long_enough)
    largest = max(args.batch_sizes) + (args.num_arrivals if args.arrivals is not None else 0)
    prompts.batch(largest, vocab_size)  # too few windows for the largest batch: said now
    notify(
        f"--prompts {files}: {len(encoded)} documents, {sum(map(len, encoded))} tokens; "
        f"{len(long_enough)} hold a window of {args.prompt_len} tokens"
    )
    return prompts
