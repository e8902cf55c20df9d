"""Training text: documents from text, JSONL and directories; splits; windows; vocab maps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagletree.adapters.text.documents import read_documents
from eagletree.app.training.data import (
    ByteTokenizer,
    WindowSampler,
    prompt_windows,
    split_documents,
    tokenize,
)
from eagletree.app.training.vocab import choose_draft_vocab, token_counts, vocab_map
from eagletree.domain.errors import ConfigurationError


def test_documents_come_from_text_jsonl_and_directories(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "b.py").write_text("print('b')\n")
    (tmp_path / "src" / "a.py").write_text("print('a')\n")
    (tmp_path / "src" / "blob.bin").write_bytes(b"\xff\xfe\x00")  # not UTF-8: skipped
    records = [{"text": "first"}, {"text": "second", "id": 2}]
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    (tmp_path / "notes.txt").write_text("plain text")
    paths = [tmp_path / "src", tmp_path / "chat.jsonl", tmp_path / "notes.txt"]
    assert read_documents(paths) == [
        "print('a')\n",
        "print('b')\n",
        "first",
        "second",
        "plain text",
    ]


def test_a_jsonl_line_without_text_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"content": "no"}\n')
    with pytest.raises(ConfigurationError, match=r"bad.jsonl:2"):
        read_documents([tmp_path / "bad.jsonl"])
    with pytest.raises(ConfigurationError, match="does not exist"):
        read_documents([tmp_path / "missing.txt"])


def test_the_split_is_seeded_and_holds_out_whole_documents() -> None:
    documents = [f"doc {i}" for i in range(20)]
    train, held = split_documents(documents, 0.1, seed=3)
    assert (train, held) == split_documents(documents, 0.1, seed=3)
    assert len(held) == 2 and sorted(train + held) == sorted(documents)
    assert split_documents(["abcdefghij"], 0.2, seed=0) == (["abcdefgh"], ["ij"])


def test_windows_depend_only_on_seed_and_step() -> None:
    tokens = tokenize(["hello world, " * 20], ByteTokenizer())
    sampler = WindowSampler(tokens, seq_len=16, batch_size=4, seed=7)
    again = WindowSampler(tokens, seq_len=16, batch_size=4, seed=7)
    assert torch.equal(sampler.batch(5), again.batch(5))
    assert not torch.equal(sampler.batch(5), sampler.batch(6))
    assert sampler.batch(0).shape == (4, 16)
    text = ByteTokenizer().decode(sampler.batch(0)[0].tolist())
    assert text in "hello world, " * 20
    with pytest.raises(ConfigurationError, match="fewer than one window"):
        WindowSampler(tokens[:10], seq_len=16, batch_size=1, seed=0)


def test_prompt_windows_are_evenly_spaced() -> None:
    tokens = torch.arange(100)
    prompts = prompt_windows(tokens, num_prompts=3, prompt_len=10)
    assert [p[0] for p in prompts] == [0, 45, 90] and all(len(p) == 10 for p in prompts)


def test_the_draft_vocabulary_keeps_the_most_frequent_ids_and_round_trips() -> None:
    counts = token_counts(torch.tensor([5, 5, 5, 1, 1, 9, 3]), vocab_size=12)
    ids = choose_draft_vocab(counts, 4)
    assert ids.tolist() == [1, 3, 5, 9]
    assert choose_draft_vocab(counts, 6).tolist() == [0, 1, 2, 3, 5, 9]  # ties: lowest ids
    maps = vocab_map(ids, vocab_size=12)
    assert maps.d2t.tolist() == [1, 2, 3, 6]  # target = draft + d2t[draft]
    assert maps.t2d.nonzero().flatten().tolist() == [1, 3, 5, 9]
    assert torch.equal(maps.target_ids, ids)
    with pytest.raises(ValueError, match="strictly increasing"):
        vocab_map(torch.tensor([3, 1]), vocab_size=12)
