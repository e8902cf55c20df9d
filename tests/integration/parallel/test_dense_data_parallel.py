"""Data-parallel attention with the dense layers sharded over the group, on the CPU: two gloo
ranks with ``parallel.shard_dense_over_dp``, each holding half of the target's MLP, embedding
and lm_head and running attention over its own requests, return exactly the single-process
greedy tokens for every worker: plain, v2 tree (Llama and MLA targets, EAGLE-1 and EAGLE-3
heads), v1 tree and multi-layer MTP. The prompts are placed so that the ranks' steps differ:
the long prompt alone on rank 0 ends at the context length first (rank 0 then steps idle), and
rank 1 admits a waiting request while rank 0 only decodes, so rank 0 runs a prefill phase with
zero rows. tp_size > 1 with the setting is refused naming both. One spawn runs every case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.random_checkpoint_config import Arch
from eagletree.app.parallel.spawned_group import spawn_ranks
from eagletree.domain.errors import ConfigurationError
from tests.integration.parallel.dense_dp_rank import dense_parameter_count, run_dense_cases
from tests.integration.parallel.test_tensor_parallel import SIZES, TREE, write_case_checkpoints
from tests.integration.spec.harness import ragged_prompts

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")

from eagletree.app.composition.container import build_engine_container
from eagletree.config.settings import EngineSettings

# the router puts [60, 4] on rank 0 and [58, 3, 5] on rank 1; with two running requests a rank,
# 60 ends after 4 tokens and 58 after 6 (context 64), and rank 1 then admits 5 beside 3
PROMPTS = ragged_prompts(SIZES.vocab_size, [60, 58, 3, 4, 5], seed=93)
MAX_NEW_TOKENS = 12
GREEDY = {"max_new_tokens": MAX_NEW_TOKENS}
# name: (target architecture, draft kind, speculative settings or None for no speculation)
CASES: dict[str, tuple[Arch, DraftKind, dict[str, Any] | None]] = {
    "plain-llama": ("llama", "eagle", None),
    "v2-tree-llama-eagle": ("llama", "eagle", TREE),
    "v1-tree-llama-eagle": ("llama", "eagle", {**TREE, "version": "v1"}),
    "v2-tree-llama-eagle3": ("llama", "eagle3", TREE),
    "v2-tree-mla-eagle": ("deepseek-mla", "eagle", TREE),
    "mtp-2-layers-mla": (
        "deepseek-mla",
        "mtp",
        {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3},
    ),
}
SPAWN_TIMEOUT_S = 180.0


def dense_options(root: Path, name: str, **parallel: Any) -> dict[str, Any]:
    arch, kind, speculative = CASES[name]
    options: dict[str, Any] = {
        "model": {
            "target_path": str(root / f"{arch}-{kind}" / "target"),
            "dtype": "float32",
            "device": "cpu",
            "max_context_len": 64,
        },
        "memory": {"max_total_tokens": 1024, "max_running_requests": 2},
        "parallel": {"shard_dense_over_dp": True, **parallel},
    }
    if speculative is not None:
        options["model"]["draft_path"] = str(root / f"{arch}-{kind}" / "draft")
        options["speculative"] = {"algorithm": kind, **speculative}
    return options


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pairs = {(arch, kind) for arch, kind, _ in CASES.values()}
    return write_case_checkpoints(tmp_path_factory.mktemp("dense-dp-checkpoints"), pairs)


@pytest.fixture(scope="module")
def dense_results(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """Each rank's results of every case (one spawn of two ranks)."""
    out = tmp_path_factory.mktemp("dense-dp-results")
    cases = {name: (dense_options(checkpoints, name, dp_size=2), GREEDY) for name in CASES}
    spawn_ranks(run_dense_cases, 2, (cases, PROMPTS, str(out)), timeout_s=SPAWN_TIMEOUT_S)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def single_process(checkpoints: Path, name: str) -> tuple[list[list[int]], int]:
    """One process's greedy outputs and dense parameter count (the setting is inert there)."""
    container = build_engine_container(
        EngineSettings(**dense_options(checkpoints, name, dp_size=1))
    )
    outputs = container.engine().generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    return [r.output_ids for r in outputs], dense_parameter_count(container.target_model())


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_dense_layers_return_the_single_process_tokens_with_half_the_weights(
    name: str, checkpoints: Path, dense_results: list[Any]
) -> None:
    expected, full_count = single_process(checkpoints, name)
    rank0, rank1 = (results[name] for results in dense_results)
    assert rank0["outputs"] == expected
    assert rank1["outputs"] == expected
    assert [len(ids) for ids in expected] == [4, 6, 12, 12, 12]  # the context ends 60 and 58
    assert rank0["dense_parameters"] * 2 == full_count
    assert rank1["dense_parameters"] * 2 == full_count


@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_runs_the_phases_any_rank_runs_one_with_zero_rows(
    name: str, dense_results: list[Any]
) -> None:
    rank0, rank1 = (results[name] for results in dense_results)
    assert rank0["num_steps"] == rank1["num_steps"] == len(rank0["phases"])
    assert [agreed for _, agreed in rank0["phases"]] == [agreed for _, agreed in rank1["phases"]]
    for own, agreed in rank0["phases"] + rank1["phases"]:
        assert agreed == [agreed[0] or own[0], agreed[1] or own[1]]  # agreed covers own
    own0 = [own for own, _ in rank0["phases"]]
    own1 = [own for own, _ in rank1["phases"]]
    # rank 1 admits while rank 0 decodes: rank 0 runs that step's prefill with zero rows
    assert any(a == [False, True] and b == [True, True] for a, b in zip(own0, own1, strict=True))
    assert rank0["num_idle_steps"] > 0  # rank 0 finished first and stepped idle
    assert rank1["num_idle_steps"] == 0


def test_tensor_parallel_with_sharded_dense_layers_is_refused_naming_both(
    checkpoints: Path,
) -> None:
    options = dense_options(checkpoints, "plain-llama", dp_size=2, tp_size=2)
    with pytest.raises(ConfigurationError, match=r"shard_dense_over_dp with parallel\.tp_size = 2"):
        build_engine_container(EngineSettings(**options))
