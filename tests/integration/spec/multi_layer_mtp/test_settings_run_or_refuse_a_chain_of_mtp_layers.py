"""Settings for a chain of MTP layers: what the worker cannot run is refused, and a
target with two MTP layers runs the multi-layer worker end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.random_checkpoint_config import sizes_with
from eagletree.app.composition.container import build_engine
from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2
from tests.integration.spec.harness import SIZES, greedy_outputs
from tests.integration.spec.multi_layer_mtp.engines import ModelCache, mtp_engine, prompts_for


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_steps": 2, "topk": 2, "num_draft_tokens": 3}, "topk must be 1"),
        ({"num_steps": 2, "num_draft_tokens": 5}, "num_draft_tokens num_steps \\+ 1"),
        ({"num_steps": 4, "num_draft_tokens": 5}, "needs 1..3 MTP layer runners"),
        ({"num_steps": 2, "num_draft_tokens": 3, "use_aux_hidden": True}, "final hidden"),
    ],
)
def test_settings_a_chain_of_mtp_layers_cannot_run_are_refused(
    mtp_models: ModelCache, options: dict[str, object], message: str
) -> None:
    models = mtp_models("deepseek-mla")
    mtp = mtp_engine(models, 3)
    drafts = mtp.drafts
    with pytest.raises(ValueError, match=message):
        MultiLayerEagleWorkerV2(
            mtp.target,
            drafts,
            draft_hidden_size=mtp.target.hidden_size,
            **options,  # type: ignore[arg-type]
        )


def test_settings_with_mtp_on_a_target_with_two_mtp_layers_run_the_multi_layer_worker(
    tmp_path: Path, device: torch.device
) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
    from eagletree.config.settings import EngineSettings

    sizes = sizes_with(SIZES, num_mtp_layers=2)
    target_dir, draft_dir = write_random_checkpoint(
        tmp_path, "deepseek-mla", "mtp", sizes=sizes, dtype=torch.float32, std=0.15
    )
    config = json.loads((target_dir / "config.json").read_text())
    config["num_nextn_predict_layers"] = 2  # the layers themselves come from draft_dir
    (target_dir / "config.json").write_text(json.dumps(config))
    model = {"target_path": str(target_dir), "dtype": "float32", "device": str(device)}
    common = {
        "backend": {"attention": "torch", "kv_move": "torch"},
        "memory": {"max_total_tokens": 1024, "max_running_requests": 4},
    }
    prompts = prompts_for([3, 6, 1], seed=70)
    plain = build_engine(EngineSettings(**common, model={**model, "max_context_len": 64}))
    expected = greedy_outputs(plain, prompts, 10)
    settings = EngineSettings(
        **common,
        model={**model, "draft_path": str(draft_dir), "max_context_len": 64},
        speculative={"algorithm": "mtp", "num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3},
    )
    engine = build_engine(settings)
    assert greedy_outputs(engine, prompts, 10) == expected
    assert engine.stats.acceptance is not None
