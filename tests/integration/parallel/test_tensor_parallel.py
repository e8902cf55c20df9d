"""Tensor parallelism on the CPU: two gloo ranks, each building its engine through the container
from the same settings with ``parallel.tp_size = 2``, emit exactly the single-process greedy
tokens for the plain, v2-tree (Llama and MLA targets, EAGLE and EAGLE-3 heads) and multi-layer
MTP workers, and the single-process samples of seeded sampling (the coins are the same; the
all-reduce's rounding moves probabilities by ~1e-7, far from any coin); both ranks emit the
same tokens (no rank diverges) and hold half of each sharded dimension. One spawn runs every
case (the processes' start-up is most of the cost)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.eagle import EagleDraft
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import Arch, ModelSizes
from eagletree.app.parallel.spawned_group import spawn_ranks
from tests.integration.parallel.tp_rank import run_cases
from tests.integration.spec.harness import WEIGHT_STD, ragged_prompts

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")

from eagletree.app.composition.container import build_engine, build_engine_container
from eagletree.config.settings import EngineSettings

SIZES = ModelSizes(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    draft_vocab_size=64,
    num_mtp_layers=2,
)
PROMPTS = ragged_prompts(SIZES.vocab_size, [3, 7, 1], seed=90)
GREEDY = {"max_new_tokens": 12}
SAMPLED = {"max_new_tokens": 12, "temperature": 1.0, "seed": 5}
TREE = {"num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 8}
# name: (target architecture, draft kind, speculative settings or None for no speculation)
CASES: dict[str, tuple[Arch, DraftKind, dict[str, Any] | None]] = {
    "plain-llama": ("llama", "eagle", None),
    "v2-tree-llama-eagle-sampled": ("llama", "eagle", TREE),
    "v2-tree-llama-eagle": ("llama", "eagle", TREE),
    "v2-tree-llama-eagle3": ("llama", "eagle3", TREE),
    "v2-tree-llama-eagle-token-map": ("llama", "eagle", {**TREE, "token_map": "token-map.json"}),
    "v2-tree-mla-eagle": ("deepseek-mla", "eagle", TREE),
    "mtp-2-layers-mla": (
        "deepseek-mla",
        "mtp",
        {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3},
    ),
}
SPAWN_TIMEOUT_S = 240.0


def generate_options(name: str) -> dict[str, Any]:
    return SAMPLED if name.endswith("-sampled") else GREEDY


def case_options(name: str, root: Path, tp_size: int) -> dict[str, Any]:
    arch, kind, speculative = CASES[name]
    target, draft = root / f"{arch}-{kind}" / "target", root / f"{arch}-{kind}" / "draft"
    options: dict[str, Any] = {
        "model": {
            "target_path": str(target),
            "dtype": "float32",
            "device": "cpu",
            "max_context_len": 64,
        },
        "memory": {"max_total_tokens": 1024, "max_running_requests": 4},
        "parallel": {"tp_size": tp_size},
    }
    if speculative is not None:
        options["model"]["draft_path"] = str(draft)
        options["speculative"] = {"algorithm": kind, **speculative}
        if "token_map" in speculative:
            options["speculative"]["token_map"] = str(root / speculative["token_map"])
    return options


def write_case_checkpoints(root: Path, pairs: Iterable[tuple[Arch, DraftKind]]) -> Path:
    """One fp32 random checkpoint of SIZES per (target arch, draft kind), at ``root/arch-kind``."""
    for arch, kind in pairs:
        write_random_checkpoint(
            root / f"{arch}-{kind}", arch, kind, sizes=SIZES, dtype=torch.float32, std=WEIGHT_STD
        )
    # a token map whose ids come from both ranks' halves of the vocabulary, shuffled
    ids = torch.randperm(SIZES.vocab_size, generator=torch.Generator().manual_seed(8))[:40]
    (root / "token-map.json").write_text(json.dumps(ids.tolist()))
    return root


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pairs = {(arch, kind) for arch, kind, _ in CASES.values()}
    return write_case_checkpoints(tmp_path_factory.mktemp("tp-checkpoints"), pairs)


@pytest.fixture(scope="module")
def tp_results(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """Each rank's results of every case (one spawn of two ranks)."""
    out = tmp_path_factory.mktemp("tp-results")
    cases = {
        name: (case_options(name, checkpoints, tp_size=2), generate_options(name)) for name in CASES
    }
    spawn_ranks(run_cases, 2, (cases, PROMPTS, str(out)), timeout_s=SPAWN_TIMEOUT_S)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("name", list(CASES))
def test_two_tensor_parallel_ranks_emit_the_single_process_tokens(
    name: str, checkpoints: Path, tp_results: list[Any]
) -> None:
    single = build_engine(EngineSettings(**case_options(name, checkpoints, tp_size=1)))
    expected = [r.output_ids for r in single.generate(PROMPTS, **generate_options(name))]
    rank0, rank1 = (results[name] for results in tp_results)
    assert rank0["outputs"] == expected
    assert rank1["outputs"] == expected


@pytest.mark.parametrize("name", list(CASES))
def test_each_rank_holds_half_of_the_vocabulary_and_of_the_kv_heads(
    name: str, tp_results: list[Any]
) -> None:
    arch, kind, speculative = CASES[name]
    for results in tp_results:
        case = results[name]
        assert case["embed_rows"] == SIZES.vocab_size // 2
        # MHA pools by kv head; MLA's latent is replicated
        latent_or_heads = SIZES.kv_lora_rank if arch == "deepseek-mla" else SIZES.num_kv_heads // 2
        assert case["kv_layout"][1] == latent_or_heads
        draft_layouts = case["draft_kv_layouts"]
        assert len(draft_layouts) == (0 if speculative is None else 2 if kind == "mtp" else 1)
        for layout in draft_layouts:  # EAGLE heads are Llama layers; MTP layers the target's
            assert layout[1] == (latent_or_heads if kind == "mtp" else SIZES.num_kv_heads // 2)


def test_a_token_mapped_head_holds_the_single_process_lm_head_rows_on_every_rank(
    checkpoints: Path, tp_results: list[Any]
) -> None:
    """The mapped rows come from both ranks' vocabulary blocks: each rank gathers them whole."""
    name = "v2-tree-llama-eagle-token-map"
    container = build_engine_container(EngineSettings(**case_options(name, checkpoints, tp_size=1)))
    (head,) = container.draft_models()
    assert isinstance(head, EagleDraft) and head.mapped_lm_head is not None
    expected = head.mapped_lm_head.weight.tolist()
    for results in tp_results:
        assert results[name]["mapped_lm_head"] == expected
