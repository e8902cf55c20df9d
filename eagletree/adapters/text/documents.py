"""Adapter: documents read from files — plain text or source (one document a file), JSONL (one
document a line, its ``"text"`` field), or directories of them (every file under one, in path
order). ``train-draft --data``, ``token-map --data`` and ``bench --prompts`` read the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from eagletree.domain.errors import ConfigurationError


def read_documents(paths: Sequence[Path]) -> list[str]:
    """Every document of ``paths`` in order; unreadable (non-UTF-8) files under a directory are
    skipped, a named one is an error; no text at all is an error."""
    documents = [document for root in paths for document in path_documents(Path(root))]
    if not documents:
        raise ConfigurationError(f"no text in the data files {[str(p) for p in paths]}")
    return documents


def path_documents(root: Path) -> list[str]:
    """The documents of one file or directory, in order (none when it holds no text)."""
    documents: list[str] = []
    for file in _files(root):
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as error:
            if file == root:
                raise ConfigurationError(f"data file {file}: {error}") from error
            continue
        if file.suffix == ".jsonl":
            documents.extend(_jsonl_texts(file, text))
        elif text:
            documents.append(text)
    return documents


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.is_file())
    elif path.is_file():
        yield path
    else:
        raise ConfigurationError(f"data file {path} does not exist")


def _jsonl_texts(file: Path, text: str) -> Iterator[str]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigurationError(f"{file}:{number}: not JSON: {error}") from error
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ConfigurationError(f'{file}:{number}: expected an object with a "text" string')
        yield record["text"]
