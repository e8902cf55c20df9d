"""App: a training corpus nobody on the team wrote — the Python sources of this machine.

The standard library and the installed packages hold real code by thousands of authors. Files
are shuffled by seed; every ``HELD_OUT_EVERY``-th file, by a hash of its path, is held out, so
the split does not depend on which files a run reads. ``train_tokenizer`` makes the byte-level
BPE (``tokenizers``) that travels with a target trained on them.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from eagletree.app.training.data import FileTokenizer

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


def prefix_by_size(texts: Sequence[str], megabytes: float) -> list[str]:
    chosen, total = [], 0
    for text in texts:
        if total >= megabytes * 2**20:
            break
        chosen.append(text)
        total += len(text)
    return chosen
