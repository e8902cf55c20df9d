"""Fixtures of the app's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import ModelSizes


@pytest.fixture
def tiny_eagle_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A random float32 Llama target of two layers and its EAGLE head: (target, draft) dirs,
    for the benchmarks that build engines over a checkpoint."""
    pytest.importorskip("dependency_injector")
    sizes = ModelSizes(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=2, num_kv_heads=1, head_dim=16)  # fmt: skip
    target, draft = write_random_checkpoint(
        tmp_path, "llama", "eagle", sizes=sizes, dtype=torch.float32
    )
    assert draft is not None
    return target, draft
