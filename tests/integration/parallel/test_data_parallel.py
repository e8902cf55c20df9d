"""Data parallelism on the CPU: two gloo ranks, each a whole engine built from the same settings
with ``parallel.dp_size = 2``, serve the requests the router gives them and together return
exactly the single-process tokens, in prompt order, on both ranks: greedy for the plain, v2-tree
and multi-layer MTP workers, and seeded sampling (prompt i's seed follows it to its rank). The
long prompt goes to rank 0 alone (least load) and ends at the context length after a few tokens,
so rank 0 runs idle steps while rank 1 still decodes. A bad prompt is refused on both ranks
before anything is queued. One spawn runs every case (the processes' start-up is most of the
cost). A rank that raises in mid-generation ends the group with its name, instead of leaving its
peer waiting."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import Arch
from eagletree.app.parallel.spawned_group import RankFailed, spawn_ranks
from tests.integration.parallel.dp_rank import (
    die_mid_generation_on_rank_one,
    fail_mid_generation_on_rank_one,
    run_cases,
)
from tests.integration.parallel.test_tensor_parallel import SIZES, case_options
from tests.integration.spec.harness import WEIGHT_STD, ragged_prompts

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")

from eagletree.app.composition.container import build_engine
from eagletree.config.settings import EngineSettings

# 60 prompt tokens leave 4 of the 64-token context: that request ends first
PROMPTS = ragged_prompts(SIZES.vocab_size, [60, 3, 5], seed=91)
BAD_PROMPT = [SIZES.vocab_size]  # outside the vocabulary
MAX_NEW_TOKENS = 12
GREEDY = {"max_new_tokens": MAX_NEW_TOKENS}
SAMPLED = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0, "seed": 5}
CASES = ["plain-llama", "v2-tree-llama-eagle", "mtp-2-layers-mla", "v2-tree-llama-eagle-sampled"]


def sampling(name: str) -> dict[str, Any]:
    return SAMPLED if name.endswith("-sampled") else GREEDY


SPAWN_TIMEOUT_S = 120.0


def dp_options(name: str, root: Path, dp_size: int) -> dict[str, Any]:
    options = case_options(name, root, tp_size=1)
    options["parallel"] = {"dp_size": dp_size}
    return options


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dp-checkpoints")
    pairs: list[tuple[Arch, DraftKind]] = [("llama", "eagle"), ("deepseek-mla", "mtp")]
    for arch, kind in pairs:
        write_random_checkpoint(
            root / f"{arch}-{kind}", arch, kind, sizes=SIZES, dtype=torch.float32, std=WEIGHT_STD
        )
    return root


@pytest.fixture(scope="module")
def dp_results(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """Each rank's results of every case (one spawn of two ranks)."""
    out = tmp_path_factory.mktemp("dp-results")
    cases = {name: (dp_options(name, checkpoints, dp_size=2), sampling(name)) for name in CASES}
    spawn_ranks(run_cases, 2, (cases, PROMPTS, BAD_PROMPT, str(out)), timeout_s=SPAWN_TIMEOUT_S)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("name", CASES)
def test_two_data_parallel_ranks_return_the_single_process_tokens_in_prompt_order(
    name: str, checkpoints: Path, dp_results: list[Any]
) -> None:
    single = build_engine(EngineSettings(**dp_options(name, checkpoints, dp_size=1)))
    expected = [r.output_ids for r in single.generate(PROMPTS, **sampling(name))]
    rank0, rank1 = (results[name] for results in dp_results)
    assert rank0["outputs"] == expected
    assert rank1["outputs"] == expected
    assert rank0["group_generated_tokens"] == sum(len(ids) for ids in expected)


@pytest.mark.parametrize("name", [name for name in CASES if sampling(name) is GREEDY])
def test_the_least_loaded_rank_takes_each_request_and_a_rank_done_first_steps_idle(
    name: str, dp_results: list[Any]
) -> None:
    rank0, rank1 = (results[name] for results in dp_results)
    assert [len(ids) for ids in rank0["outputs"]] == [4, MAX_NEW_TOKENS, MAX_NEW_TOKENS]
    # 60 tokens to rank 0; then rank 1 is the least loaded for both short prompts
    assert rank0["prefill_tokens"] == 60
    assert rank1["prefill_tokens"] == 3 + 5
    # lockstep: the same number of steps; rank 0's request ends after 4 tokens, it idles
    assert rank0["num_steps"] == rank1["num_steps"] == rank0["group_steps"]
    assert rank0["num_idle_steps"] > 0
    assert rank1["num_idle_steps"] == 0


def test_a_bad_prompt_is_refused_on_every_rank_before_anything_is_queued(
    dp_results: list[Any],
) -> None:
    for results in dp_results:
        for name in CASES:
            refused = results[name]["refused"]
            assert refused is not None and refused.startswith("request 3: token id 96 ")


def test_a_data_parallel_rank_that_raises_ends_the_group_naming_it(checkpoints: Path) -> None:
    options = dp_options("plain-llama", checkpoints, dp_size=2)
    started = time.monotonic()
    with pytest.raises(RankFailed, match=r"(?s)rank 1 of 2 failed first.*rank 1 broke on purpose"):
        spawn_ranks(fail_mid_generation_on_rank_one, 2, (options, PROMPTS), timeout_s=60)
    assert time.monotonic() - started < 60


def test_a_data_parallel_rank_that_dies_ends_the_group_naming_it(checkpoints: Path) -> None:
    options = dp_options("plain-llama", checkpoints, dp_size=2)
    started = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 of 2 failed first:\ndied without a Python error"):
        spawn_ranks(die_mid_generation_on_rank_one, 2, (options, PROMPTS), timeout_s=60)
    assert time.monotonic() - started < 60
