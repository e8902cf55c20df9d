"""`eagletree bench --prompts`: documents cut into prompts by the target's tokenizer, the same
for the same seed and batch, distinct within a batch, and one-line errors for what cannot be."""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer
from eagletree.adapters.text.hf_tokenizer import load_tokenizer
from eagletree.app.bench.prompts import BenchPrompts, bench_prompts
from eagletree.domain.errors import ConfigurationError

VOCAB = 512
WORDS = ("def", "return", "tree", "draft", "verify", "accept", "model", "token", "batch", "step")


def text(seed: int, num_words: int) -> str:
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (num_words,), generator=generator).tolist()
    return " ".join(WORDS[i] for i in picks)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A target directory with what --prompts reads: config.json and a tokenizer."""
    directory = tmp_path_factory.mktemp("target")
    (directory / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    write_byte_level_tokenizer(directory, VOCAB)
    return directory


def flags(
    prompts: Sequence[Path], prompt_len: int = 8, seed: int = 0, bs: int = 4
) -> argparse.Namespace:
    return argparse.Namespace(
        prompts=list(prompts), prompt_len=prompt_len, seed=seed, batch_sizes=[1, bs],
        arrivals=None, num_arrivals=8,
    )  # fmt: skip


def windows_of(documents: Sequence[torch.Tensor], prompt: list[int]) -> list[tuple[int, int]]:
    """Every (document, start) at which ``prompt`` is a run of consecutive tokens."""
    return [
        (d, start)
        for d, tokens in enumerate(documents)
        for start in range(len(tokens) - len(prompt) + 1)
        if tokens[start : start + len(prompt)].tolist() == prompt
    ]


def test_jsonl_and_text_files_are_cut_into_windows_of_the_targets_tokens(
    target: Path, tmp_path: Path
) -> None:
    texts = [text(i, 30) for i in range(5)]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "more.py").write_text(text(9, 40))
    notes: list[str] = []
    prompts = bench_prompts(
        flags([tmp_path / "held.jsonl", tmp_path / "more.py"]), target, notes.append
    )
    tokenizer = load_tokenizer(target)  # the engine's, as generate encodes a text prompt
    assert tokenizer is not None
    encoded = [tokenizer.encode(t) for t in [*texts, text(9, 40)]]
    assert [d.tolist() for d in prompts.documents] == encoded
    batch = prompts.batch(4, VOCAB)
    assert all(len(p) == 8 for p in batch)
    found = [windows_of(prompts.documents, p) for p in batch]
    assert all(found)  # every prompt is a window of one document
    # as many documents as requests: each from another document
    assert len({where[0][0] for where in found}) == 4
    assert "6 documents" in notes[0] and "6 hold a window of 8 tokens" in notes[0]


def test_the_prompts_depend_only_on_the_seed_and_the_number_of_prompts(
    target: Path, tmp_path: Path
) -> None:
    (tmp_path / "held.jsonl").write_text(
        "".join(json.dumps({"text": text(i, 40)}) + "\n" for i in range(12))
    )
    files = [tmp_path / "held.jsonl"]
    first = bench_prompts(flags(files, seed=1), target, print)
    again = bench_prompts(flags(files, seed=1), target, print)
    other = bench_prompts(flags(files, seed=2), target, print)
    assert first.batch(4, VOCAB) == again.batch(4, VOCAB)  # every configuration's bs 4
    assert first.batch(4, VOCAB) != other.batch(4, VOCAB)
    random_ids = BenchPrompts(8, 1)
    assert random_ids.batch(3, VOCAB) == BenchPrompts(8, 1).batch(3, VOCAB)
    assert random_ids.batch(3, VOCAB) != BenchPrompts(8, 2).batch(3, VOCAB)
    assert all(len(p) == 8 and all(0 <= t < VOCAB for t in p) for p in random_ids.batch(3, VOCAB))
    # another draw is another choice of windows; draw 0 is the default
    assert first.batch(4, VOCAB, draw=0) == first.batch(4, VOCAB)
    assert first.batch(4, VOCAB, draw=1) != first.batch(4, VOCAB)
    assert first.batch(4, VOCAB, draw=1) == again.batch(4, VOCAB, draw=1)
    assert random_ids.batch(3, VOCAB, draw=1) != random_ids.batch(3, VOCAB)


def test_fewer_documents_than_requests_give_non_overlapping_windows() -> None:
    documents = (torch.arange(100, 130), torch.arange(200, 225))  # 30 and 25 tokens
    prompts = BenchPrompts(8, 0, documents)
    assert prompts.num_windows == 3 + 3
    batch = prompts.batch(6, VOCAB)
    taken = [windows_of(documents, p) for p in batch]
    assert all(len(where) == 1 for where in taken)
    by_document: dict[int, list[int]] = {}
    for ((d, start),) in taken:
        by_document.setdefault(d, []).append(start)
    assert sorted(by_document) == [0, 1]  # both documents, in turn
    for starts in by_document.values():
        ordered = sorted(starts)
        assert all(b - a >= 8 for a, b in itertools.pairwise(ordered))
    with pytest.raises(ConfigurationError, match="6 non-overlapping windows of --prompt-len 8"):
        prompts.batch(7, VOCAB)


def test_a_target_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    (tmp_path / "held.txt").write_text(text(0, 30))
    with pytest.raises(
        ConfigurationError, match=r"--prompts needs the target's tokenizer"
    ) as error:
        bench_prompts(flags([tmp_path / "held.txt"]), tmp_path, print)
    assert str(tmp_path) in str(error.value) and "leave --prompts out" in str(error.value)


def test_a_file_without_text_and_documents_too_short_are_named(
    target: Path, tmp_path: Path
) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigurationError, match=r"--prompts \S*empty.jsonl holds no text: give"):
        bench_prompts(flags([tmp_path / "empty.jsonl"]), target, print)
    (tmp_path / "short.txt").write_text("def f")
    with pytest.raises(ConfigurationError, match=r"no document of --prompts \S*short.txt has "
                       r"--prompt-len 64 tokens \(the longest has \d+\)"):  # fmt: skip
        bench_prompts(flags([tmp_path / "short.txt"], prompt_len=64), target, print)
    (tmp_path / "one.txt").write_text(text(0, 30))  # windows for bs 1, not for bs 64
    with pytest.raises(ConfigurationError, match="fewer than the 64 requests of one batch"):
        bench_prompts(flags([tmp_path / "one.txt"], bs=64), target, print)
