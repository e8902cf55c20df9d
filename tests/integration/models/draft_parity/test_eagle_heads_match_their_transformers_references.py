"""Parity of the EAGLE-1 and EAGLE-3 heads over their KV pools with references
assembled from transformers' Llama layers (EAGLE-3 over the target vocabulary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.draft_loading import load_draft
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.runner import DraftModelRunner
from tests.integration.models.draft_parity.references import (
    HIDDEN,
    eagle3_reference,
    eagle_reference,
    llama_config,
    run_draft_against_reference,
)
from tests.integration.models.harness import (
    BACKENDS,
    Memory,
    perturb_parameters,
    skip_unless_backend_runs,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


@pytest.fixture
def llama_target(tmp_path: Path) -> Any:
    model = transformers.LlamaForCausalLM(llama_config(num_hidden_layers=2)).eval()
    perturb_parameters(model, seed=21)
    model.save_pretrained(tmp_path / "target")
    return model


@pytest.mark.parametrize("backend", BACKENDS)
def test_eagle_head_matches_its_transformers_reference(
    tmp_path: Path, device: torch.device, backend: str, llama_target: Any
) -> None:
    skip_unless_backend_runs(backend, device)
    path, reference = eagle_reference(tmp_path, llama_target)
    target = load_target(tmp_path / "target", torch.float32, device)
    (head,) = load_draft(path, "eagle", target, torch.float32)
    memory = Memory(device)
    runner = DraftModelRunner(head, *memory.runner_parts(head.kv_layout, backend, torch.float32))
    run_draft_against_reference(runner, memory, reference, HIDDEN)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eagle3_head_matches_its_transformers_reference_over_the_target_vocabulary(
    tmp_path: Path, device: torch.device, backend: str, llama_target: Any
) -> None:
    skip_unless_backend_runs(backend, device)
    path, reference, fuse = eagle3_reference(tmp_path, llama_target, draft_vocab=23)
    target = load_target(tmp_path / "target", torch.float32, device)
    (head,) = load_draft(path, "eagle3", target, torch.float32)
    assert isinstance(head, Eagle3Draft)
    memory = Memory(device)
    runner = DraftModelRunner(head, *memory.runner_parts(head.kv_layout, backend, torch.float32))
    run_draft_against_reference(runner, memory, reference, 3 * HIDDEN, fuse)
