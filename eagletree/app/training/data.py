"""App: training text — documents (read by ``adapters/text/documents.py``) tokenised, split,
and sampled as windows.

Tokens come from the target's ``tokenizer.json`` (the ``tokenizers`` library) or, without one,
are UTF-8 bytes. Batches are a function of (seed, step), so a resumed run sees exactly the
batches an uninterrupted one would.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from eagletree.domain.errors import ConfigurationError


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids (a target with a 256-token byte vocabulary)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class FileTokenizer:
    """A ``tokenizer.json`` read by the ``tokenizers`` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encoded in parallel by the library's thread pool."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size())

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)


BYTE_VOCAB_SIZE = 256


def load_tokenizer(target_dir: Path, vocab_size: int) -> TextTokenizer:
    """The target's ``tokenizer.json``; without one, UTF-8 bytes for a byte-vocabulary target
    (``check_byte_vocabulary``)."""
    file = target_dir / "tokenizer.json"
    if file.is_file():
        return FileTokenizer(file)
    check_byte_vocabulary(target_dir, vocab_size, "tokenizer.json")
    return ByteTokenizer()


def check_byte_vocabulary(target_dir: Path, vocab_size: int, files: str) -> None:
    """A target without a tokenizer is read as UTF-8 bytes only when its vocabulary is exactly
    the 256 bytes: any other vocabulary gives byte values other meanings, so the ids counted or
    trained on would be the wrong tokens (train-draft and token-map follow the same rule)."""
    if vocab_size != BYTE_VOCAB_SIZE:
        raise ConfigurationError(
            f"{target_dir} has no tokenizer ({files} beside config.json) and its vocabulary "
            f"of {vocab_size} ids is not the {BYTE_VOCAB_SIZE} bytes: put the target's "
            "tokenizer beside its weights"
        )


def add_data_argument(parser: argparse.ArgumentParser) -> None:
    """``--data FILE...``: what ``documents.read_documents`` reads (train-draft, token-map)."""
    parser.add_argument(
        "--data",
        required=True,
        nargs="+",
        type=Path,
        metavar="FILE",
        help='text, JSONL with a "text" field, source files, or directories of them',
    )


def split_documents(
    documents: Sequence[str], held_out_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
    """(train, held_out): a seeded choice of whole documents; one document is split at the end."""
    if len(documents) == 1:
        text = documents[0]
        cut = int(len(text) * (1 - held_out_fraction))
        return [text[:cut]], [text[cut:]]
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(documents), generator=generator).tolist()
    num_held = max(1, round(len(documents) * held_out_fraction))
    held = set(order[:num_held])
    train = [d for i, d in enumerate(documents) if i not in held]
    return train, [d for i, d in enumerate(documents) if i in held]


def tokenize(
    documents: Sequence[str], tokenizer: TextTokenizer, separator: Sequence[int] = ()
) -> torch.Tensor:
    """(num_tokens,) int64: the documents' tokens, each followed by ``separator``."""
    ids: list[int] = []
    for encoded in tokenizer.encode_batch(documents):
        ids.extend(encoded)
        ids.extend(separator)
    return torch.tensor(ids, dtype=torch.int64)


class WindowSampler:
    """Random windows of ``seq_len`` tokens; batch ``step`` depends only on (seed, step)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, seed: int) -> None:
        if tokens.numel() < seq_len + 1:
            raise ConfigurationError(
                f"the training text has {tokens.numel()} tokens, fewer than one window of"
                f" {seq_len + 1}: give more data or a shorter --seq-len"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed

    def batch(self, step: int) -> torch.Tensor:
        """(batch_size, seq_len) int64."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(
            0, self.tokens.numel() - self.seq_len + 1, (self.batch_size,), generator=generator
        )
        return torch.stack([self.tokens[s : s + self.seq_len] for s in starts.tolist()])


def prompt_windows(tokens: torch.Tensor, num_prompts: int, prompt_len: int) -> list[list[int]]:
    """``num_prompts`` evenly spaced windows of ``prompt_len`` tokens (fewer if the text is
    short)."""
    span = tokens.numel() - prompt_len
    if span < 0:
        return []
    count = min(num_prompts, span + 1)
    starts = [round(i * span / max(count - 1, 1)) for i in range(count)]
    return [tokens[s : s + prompt_len].tolist() for s in starts]
