"""The `eagletree token-map` command: a token map from a corpus — its most frequent target ids.

FR-Spec's recipe: count the target tokenizer's ids over text like what will be generated and
keep the N most frequent; an EAGLE head under ``speculative.token_map`` then proposes from those
N only (its lm_head and top-k shrink by the same factor) while the target still verifies over
the whole vocabulary, so the output does not change. The map is written most frequent first
(ties by id), as a ``.pt`` int64 tensor or a ``.json`` list; the summary says which share of the
corpus's tokens it covers, the upper bound on the draft tokens it can still propose.

    eagletree token-map --target DIR --data corpus.jsonl src/ --size 32768 --out hot.pt
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.text.documents import read_documents
from eagletree.app.training.data import (
    ByteTokenizer,
    add_data_argument,
    check_byte_vocabulary,
)
from eagletree.app.training.vocab import frequency_ranked, token_counts
from eagletree.domain.errors import ConfigurationError

DOCUMENTS_PER_BATCH = 256
DEFAULT_SIZE = 32768  # FR-Spec's size for Llama-3's 128k vocabulary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eagletree token-map", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--target", required=True, type=Path, metavar="DIR", help="target checkpoint")
    add_data_argument(p)
    p.add_argument(
        "--size",
        type=int,
        help=f"tokens in the map (default: {DEFAULT_SIZE}, or a quarter of a smaller vocabulary)",
    )
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="a .pt or .json file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """0 ok, 1 bad input (said on stderr), 2 bad flags."""
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.size is not None and args.size < 1:
        p.error(f"--size must be at least 1, got {args.size}")
    if args.out.suffix.lower() not in (".pt", ".json"):
        p.error(f"--out must end in .pt or .json, got {args.out.name}")
    try:
        write_token_map(args.target, args.data, args.size, args.out)
    except ConfigurationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def write_token_map(
    target: Path, data: Sequence[Path], size: int | None, out: Path
) -> torch.Tensor:
    """Count ``data``'s tokens with ``target``'s tokenizer, write the ``size`` most frequent ids
    to ``out`` and return them; progress and the summary go to stderr."""
    from eagletree.adapters.text.hf_tokenizer import load_tokenizer

    vocab_size = ConfigReader.from_dir(target).get_int("vocab_size")
    if size is None:
        size = min(DEFAULT_SIZE, max(1, vocab_size // 4))
    if size > vocab_size:
        raise ConfigurationError(f"--size {size} exceeds the target vocabulary ({vocab_size})")
    tokenizer = load_tokenizer(target)  # the engine's: the ids the draft will propose
    encode = ByteTokenizer().encode if tokenizer is None else tokenizer.encode
    if tokenizer is None:  # as train-draft: bytes for a byte vocabulary, else refused
        check_byte_vocabulary(target, vocab_size, "tokenizer.json or tokenizer.model")
    documents = read_documents(data)
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for start in range(0, len(documents), DOCUMENTS_PER_BATCH):
        batch = documents[start : start + DOCUMENTS_PER_BATCH]
        tokens = [token for document in batch for token in encode(document)]
        counts += token_counts(torch.tensor(tokens, dtype=torch.int64), vocab_size)
        done = min(start + DOCUMENTS_PER_BATCH, len(documents))
        print(f"\rcounted {done}/{len(documents)} documents", end="", file=sys.stderr)
    print(file=sys.stderr)
    ids = frequency_ranked(counts, size)
    total = int(counts.sum())
    covered = int(counts[ids].sum())
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".json":
        out.write_text(json.dumps(ids.tolist()))
    else:
        torch.save(ids, out)
    share = covered / total if total else 0.0
    print(
        f"wrote {out}: the {size} most frequent of {vocab_size} ids cover {share:.1%} of the "
        f"corpus's {total:,} tokens ({int((counts > 0).sum()):,} distinct ids seen)",
        file=sys.stderr,
    )
    return ids
