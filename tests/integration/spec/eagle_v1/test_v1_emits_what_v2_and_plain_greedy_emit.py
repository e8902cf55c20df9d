"""EagleWorkerV1 is lossless: v1 == v2 == plain greedy with the same acceptance, with
a random draft on ragged batches, seeded sampling on either page size, and on the
Triton backend."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import requires_triton
from tests.integration.spec.eagle_v1.engines import (
    CONFIGS,
    MAX_NEW,
    ModelCache,
    oracle_v1_engine,
    oracle_v2_engine,
    prompts_for,
    v1_engine,
)
from tests.integration.spec.harness import greedy_outputs, plain_engine


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "S{}k{}N{}".format(*c))
@pytest.mark.parametrize("model", [("llama", "eagle"), ("deepseek-mla", "eagle")], ids="-".join)
def test_v1_v2_and_plain_greedy_emit_the_same_tokens_with_the_same_acceptance(
    spec_models: ModelCache,
    model: tuple[str, str],
    config: tuple[int, int, int],
    device: torch.device,
) -> None:
    models = spec_models(*model, device)
    prompts = prompts_for(4, seed=sum(config))
    v1, expected = oracle_v1_engine(models, config, prompts, MAX_NEW)
    ours = v1.engine.generate(prompts, max_new_tokens=MAX_NEW)
    v2 = oracle_v2_engine(models, config, prompts).generate(prompts, max_new_tokens=MAX_NEW)
    assert [r.output_ids for r in ours] == expected
    assert [r.output_ids for r in v2] == expected
    assert [r.acceptance for r in ours] == [r.acceptance for r in v2]
    stats = v1.engine.stats.acceptance
    assert stats is not None
    assert stats.mean_accept_length == 2.0 if config[0] == 1 else stats.mean_accept_length > 2.0
    assert v1.allocator.available_size() == v1.allocator.size


@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_v1_with_a_random_draft_is_lossless_for_ragged_batches_of_1_to_4(
    spec_models: ModelCache, batch_size: int
) -> None:
    models = spec_models("llama", "eagle3", torch.device("cpu"))
    prompts = prompts_for(batch_size, seed=40 + batch_size)
    expected = greedy_outputs(plain_engine(models), prompts, MAX_NEW)
    v1 = v1_engine(models, (4, 4, 12))
    assert greedy_outputs(v1.engine, prompts, MAX_NEW) == expected


def test_v1_sampling_is_seeded_and_with_top_k_1_it_is_greedy(spec_models: ModelCache) -> None:
    models = spec_models("llama", "eagle", torch.device("cpu"))
    prompts = prompts_for(3, seed=50)
    expected = greedy_outputs(plain_engine(models), prompts, MAX_NEW)
    v1 = v1_engine(models, (4, 4, 12))
    top1 = v1.engine.generate(prompts, MAX_NEW, temperature=1.5, top_k=1, seed=3)
    assert [r.output_ids for r in top1] == expected
    sampled = [
        [
            r.output_ids
            for r in v1_engine(models, (4, 4, 12), page_size=page).engine.generate(
                prompts, MAX_NEW, temperature=1.0, top_p=0.9, seed=5
            )
        ]
        for page in (1, 4, 1)
    ]
    assert sampled[0] == sampled[1] == sampled[2] != expected
    assert v1.allocator.available_size() == v1.allocator.size


@pytest.mark.parametrize("page_size", [1, 4])
def test_v1_on_the_triton_backend_is_lossless(
    spec_models: ModelCache, page_size: int, device: torch.device
) -> None:
    requires_triton(device)
    models = spec_models("llama", "eagle", device)
    prompts = prompts_for(2, seed=4)
    expected = greedy_outputs(plain_engine(models, backend="triton"), prompts, 6)
    v1 = v1_engine(models, (3, 2, 6), page_size=page_size, backend="triton")
    assert greedy_outputs(v1.engine, prompts, 6) == expected
