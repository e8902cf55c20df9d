"""Settings with page_size 4 and a tree resolve to v1 and run it end to end, lossless."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagletree.app.composition.container import build_engine
from tests.integration.spec.eagle_v1.engines import prompts_for
from tests.integration.spec.harness import SIZES, greedy_outputs


def test_settings_with_page_size_4_and_a_tree_run_v1_end_to_end(
    tmp_path: Path, device: torch.device
) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
    from eagletree.config.settings import EngineSettings

    target_dir, draft_dir = write_random_checkpoint(
        tmp_path, "llama", "eagle", sizes=SIZES, dtype=torch.float32, std=0.15
    )
    model = {
        "target_path": str(target_dir),
        "draft_path": str(draft_dir),
        "dtype": "float32",
        "device": str(device),
        "max_context_len": 64,
    }
    common = {"model": model, "backend": {"attention": "torch", "kv_move": "torch"}}
    memory = {"max_total_tokens": 1024, "max_running_requests": 4}
    prompts = prompts_for(3, seed=70)
    plain = build_engine(EngineSettings(**common, memory=memory))
    expected = greedy_outputs(plain, prompts, 10)
    settings = EngineSettings(
        **common,
        memory={**memory, "page_size": 4},
        speculative={"algorithm": "eagle", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8},
    )
    engine = build_engine(settings)
    assert greedy_outputs(engine, prompts, 10) == expected
    assert engine.stats.acceptance is not None
