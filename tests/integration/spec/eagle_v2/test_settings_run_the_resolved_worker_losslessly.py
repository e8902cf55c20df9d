"""Settings to speculation: Engine.from_settings picks the resolved worker for each
algorithm and stays lossless, and `eagletree generate` prints the acceptance."""

from __future__ import annotations

import argparse
import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.random_checkpoint_config import Arch
from eagletree.app.composition.container import build_engine
from tests.integration.spec.eagle_v2.engines import prompts_for, random_checkpoints
from tests.integration.spec.harness import greedy_outputs


@dataclasses.dataclass(frozen=True)
class SettingsCase:
    arch: Arch
    kind: DraftKind
    num_mtp_layers: int  # declared by the target
    speculative: dict[str, Any]
    worker: str  # the class the container's resolution must pick


SETTINGS_CASES = {
    "eagle-v2": SettingsCase(
        "llama",
        "eagle",
        1,
        {"num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8},
        "EagleWorkerV2",
    ),
    "eagle3-v2": SettingsCase(
        "llama",
        "eagle3",
        1,
        {"num_steps": 2, "eagle_topk": 2, "num_draft_tokens": 4},
        "EagleWorkerV2",
    ),
    "eagle-v1": SettingsCase(
        "llama",
        "eagle",
        1,
        {"num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 6, "version": "v1"},
        "EagleWorkerV1",
    ),
    "mtp-v2": SettingsCase(
        "deepseek-mla",
        "mtp",
        1,
        {"num_steps": 2, "eagle_topk": 2, "num_draft_tokens": 4},
        "EagleWorkerV2",
    ),
    "mtp-multi-layer": SettingsCase(
        "deepseek-mla",
        "mtp",
        2,
        {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3},
        "MultiLayerEagleWorkerV2",
    ),
}


@pytest.mark.parametrize("name", list(SETTINGS_CASES))
def test_engine_from_settings_speculates_with_the_resolved_worker_and_stays_lossless(
    name: str, tmp_path: Path, device: torch.device
) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.config.settings import EngineSettings

    case = SETTINGS_CASES[name]
    target_path, draft_path = random_checkpoints(
        tmp_path, case.arch, case.kind, case.num_mtp_layers
    )
    backend = {"attention": "torch", "kv_move": "torch"}
    memory = {"max_total_tokens": 1024, "max_running_requests": 4}
    model = {"target_path": target_path, "device": str(device), "dtype": "float32"}
    plain = build_engine(EngineSettings(model=model, backend=backend, memory=memory))
    assert plain.overlap is (device.type == "cuda")  # auto: the plain worker runs ahead on CUDA
    overlap = case.worker != "EagleWorkerV1"  # "on" is kept for the v2 workers, even on the CPU
    engine = build_engine(
        EngineSettings(
            model={**model, "draft_path": draft_path},
            speculative={"algorithm": case.kind, **case.speculative},
            backend=backend,
            memory=memory,
            scheduler={"overlap": "on" if overlap else "auto"},
        )
    )
    assert type(engine.worker).__name__ == case.worker
    assert engine.overlap is overlap
    prompts = prompts_for(3, seed=70)
    expected = greedy_outputs(plain, prompts, 10)
    results = engine.generate(prompts, max_new_tokens=10)
    assert [r.output_ids for r in results] == expected
    assert engine.stats.acceptance is not None
    assert all(r.acceptance is not None for r in results)


def test_generate_prints_the_mean_acceptance_length_and_the_histogram(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_settings")
    from eagletree.app.cli import generate as generate_cli

    target_path, draft_path = random_checkpoints(tmp_path, "llama", "eagle")
    settings_file = tmp_path / "settings.toml"
    settings_file.write_text(
        f'[model]\ntarget_path = "{target_path}"\ndraft_path = "{draft_path}"\n'
        'device = "cpu"\ndtype = "float32"\n'
        '[speculative]\nalgorithm = "eagle"\nnum_steps = 3\neagle_topk = 4\nnum_draft_tokens = 8\n'
        "[memory]\nmax_total_tokens = 1024\nmax_running_requests = 4\n"
        '[backend]\nattention = "torch"\nkv_move = "torch"\n'
    )
    parser = argparse.ArgumentParser(prog="eagletree")
    generate_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "generate",
            "--settings",
            str(settings_file),
            "--prompt-ids",
            "1 2 3",
            "--prompt-ids",
            "4 5",
            "--max-new-tokens",
            "8",
            "--no-progress",
        ]
    )
    out, err = io.StringIO(), io.StringIO()
    assert generate_cli.run(args, out=out, err=err) == 0
    [line] = [x for x in err.getvalue().splitlines() if x.startswith("speculation:")]
    assert "mean acceptance length" in line and "histogram (tokens: steps)" in line
    assert len(out.getvalue().splitlines()) == 2
