"""The trained target and heads, built once for the folder's modules (which
tests/xdist_scheduling.py keeps together on one worker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.real_pair.target import TargetTraining, train_target
from eagletree.app.training.data import ByteTokenizer, tokenize
from tests.integration.train_draft.pair import SPEC, Pair, Trained, synthetic_corpus, train


@pytest.fixture(scope="package")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    pair = Pair(tmp_path_factory.mktemp("pair"))
    text = synthetic_corpus(3000, seed=0)
    pair.corpus.write_text(text)
    tokens = tokenize([text], ByteTokenizer())
    training = TargetTraining(max_steps=200, batch_size=16, seq_len=64, lr=3e-3, seed=0)
    losses = train_target(SPEC, tokens, pair.target, training)
    assert sum(losses[-10:]) / 10 < 0.5  # the grammar's entropy floor is about 0.25
    return pair


@pytest.fixture(scope="package")
def trained(pair: Pair, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The head of each algorithm trained with TRAIN_ARGS, once per folder: (its dir, report)."""
    heads: dict[str, tuple[Path, dict[str, Any]]] = {}

    def head(algorithm: str) -> tuple[Path, dict[str, Any]]:
        if algorithm not in heads:
            out = tmp_path_factory.mktemp(f"trained-{algorithm}")
            heads[algorithm] = (out, train(pair, algorithm, out))
        return heads[algorithm]

    return head
