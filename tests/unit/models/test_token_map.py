"""Reading token maps: FR-Spec's .pt tensors and .json lists, in their order; bad files named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.token_map import read_token_map
from eagletree.domain.errors import ConfigurationError


@pytest.mark.parametrize("suffix", [".pt", ".json"])
def test_a_map_keeps_its_ids_in_file_order(tmp_path: Path, suffix: str) -> None:
    ids = torch.randperm(1000, generator=torch.Generator().manual_seed(1))[:64]
    path = tmp_path / f"freq_64{suffix}"
    if suffix == ".pt":
        torch.save(ids.to(torch.int32), path)
    else:
        path.write_text(json.dumps(ids.tolist()))
    read = read_token_map(path, vocab_size=1000)
    assert read.dtype == torch.int64 and torch.equal(read, ids)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("map.txt", "1 2 3", r"unknown format '\.txt'"),
        ("map.json", "[[1, 2], [3, 4]]", r"expected a non-empty list of ids, got shape"),
        ("map.json", "[]", r"expected a non-empty list of ids"),
        ("map.json", "[true, false]", r"token ids must be integers"),
        ("map.json", "{not json", r"cannot be read as token ids"),
        ("map.pt", "not a tensor file", r"cannot be read as token ids"),
        ("map.json", "[-1, 4]", r"ids -1\.\.4 leave the target vocabulary 0\.\.9"),
    ],
)
def test_a_bad_map_is_refused_naming_the_file(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigurationError, match=message) as raised:
        read_token_map(path, vocab_size=10)
    assert str(path) in str(raised.value)
