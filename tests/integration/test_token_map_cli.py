"""`eagletree token-map`: a corpus's most frequent target ids, most frequent first, in a file
that `speculative.token_map` reads back; the summary states the corpus share it covers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.token_map import read_token_map
from eagletree.adapters.text.hf_tokenizer import load_tokenizer
from eagletree.app.cli.main import main

VOCAB = 300


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A target directory with a byte-level BPE tokenizer (what the engine would load)."""
    from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer

    directory = tmp_path / "target"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    write_byte_level_tokenizer(directory, VOCAB)
    return directory


@pytest.mark.parametrize("suffix", [".pt", ".json"])
def test_the_map_holds_the_most_frequent_ids_first_and_reads_back(
    tmp_path: Path, target: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = torch.Generator().manual_seed(5)
    letters = "abcdefghij"
    texts = ["".join(letters[i] for i in torch.randint(10, (60,), generator=rng)) for _ in range(9)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts[:5]))
    (corpus / "b.txt").write_text("".join(texts[5:]))
    out = tmp_path / "maps" / f"hot{suffix}"
    assert main(["token-map", "--target", str(target), "--data", str(corpus), "--size", "4",
                 "--out", str(out)]) == 0  # fmt: skip
    tokenizer = load_tokenizer(target)
    assert tokenizer is not None
    documents = [*texts[:5], "".join(texts[5:])]  # the JSONL's lines, the text file whole
    counts = Counter(token for text in documents for token in tokenizer.encode(text))
    ranked = sorted(counts, key=lambda token: (-counts[token], token))[:4]
    assert read_token_map(out, VOCAB).tolist() == ranked
    share = sum(counts[b] for b in ranked) / sum(counts.values())
    assert f"cover {share:.1%} of the corpus's {sum(counts.values()):,} tokens" in (
        capsys.readouterr().err
    )


def test_a_target_without_a_tokenizer_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    (tmp_path / "c.txt").write_text("text")
    argv = ["token-map", "--target", str(bare), "--data", str(tmp_path / "c.txt")]
    assert main([*argv, "--out", str(tmp_path / "m.pt")]) == 1
    assert "has no tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "m.pt").exists()


def test_a_map_larger_than_the_vocabulary_or_of_an_unknown_format_is_refused(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text")
    args = ["token-map", "--target", str(target), "--data", str(corpus)]
    assert main([*args, "--size", str(VOCAB + 1), "--out", str(tmp_path / "m.pt")]) == 1
    assert f"--size {VOCAB + 1} exceeds the target vocabulary ({VOCAB})" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main([*args, "--out", str(tmp_path / "m.txt")])
    assert exited.value.code == 2
    assert "--out must end in .pt or .json" in capsys.readouterr().err


def test_a_byte_vocabulary_without_a_tokenizer_counts_bytes_as_train_draft_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bytes"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"vocab_size": 256}))
    (tmp_path / "c.txt").write_text("aab")
    out = tmp_path / "m.json"
    argv = ["token-map", "--target", str(bare), "--data", str(tmp_path / "c.txt")]
    assert main([*argv, "--size", "2", "--out", str(out)]) == 0, capsys.readouterr().err
    assert read_token_map(out, 256).tolist() == [ord("a"), ord("b")]


def test_a_document_longer_than_the_tokenizers_limit_is_counted_without_its_warning(
    tmp_path: Path, target: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "long.txt").write_text("ab " * 4000)  # past the tokenizer's 4096 tokens
    argv = ["token-map", "--target", str(target), "--data", str(tmp_path / "long.txt")]
    assert main([*argv, "--size", "2", "--out", str(tmp_path / "m.pt")]) == 0
    assert "sequence length is longer" not in capfd.readouterr().err
