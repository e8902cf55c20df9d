"""MultiLayerEagleWorkerV2 greedy losslessness over DeepSeek-MLA and Llama targets
with several MTP layers: random and oracle layers, ragged batches, seeded sampling,
the Triton backend, and bucketed (padded, on CUDA replayed) steps."""

from __future__ import annotations

import pytest
import torch

from eagletree.app.engine.loop import Engine
from eagletree.domain.sampling import SamplingParams
from tests.conftest import requires_triton
from tests.integration.spec.harness import greedy_outputs, plain_engine
from tests.integration.spec.multi_layer_mtp.engines import (
    MAX_NEW,
    ModelCache,
    mtp_engine,
    prompts_for,
)


@pytest.mark.parametrize(
    ("arch", "num_steps"),
    [("deepseek-mla", 1), ("deepseek-mla", 2), ("deepseek-mla", 3), ("llama", 2)],
)
@pytest.mark.parametrize("oracle", [False, True], ids=["random", "oracle"])
def test_multi_layer_mtp_emits_the_plain_greedy_tokens(
    mtp_models: ModelCache, arch: str, num_steps: int, oracle: bool, device: torch.device
) -> None:
    models = mtp_models(arch, device)
    prompts = prompts_for([3, 7, 1, 12], seed=num_steps)
    expected = greedy_outputs(plain_engine(models), prompts, MAX_NEW)
    mtp = mtp_engine(models, num_steps, prompts=prompts if oracle else ())
    results = mtp.engine.generate(prompts, max_new_tokens=MAX_NEW)
    assert [r.output_ids for r in results] == expected
    stats = mtp.engine.stats.acceptance
    assert stats is not None
    if oracle and num_steps > 1:
        assert stats.mean_accept_length > 2.0
        assert stats.histogram[1] > 0  # and some drafts were wrong
    assert mtp.allocator.available_size() == mtp.allocator.size


@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_multi_layer_mtp_is_lossless_for_ragged_batches_of_1_to_4(
    mtp_models: ModelCache, batch_size: int
) -> None:
    models = mtp_models("deepseek-mla")
    prompts = prompts_for([5, 2, 9, 1][:batch_size], seed=batch_size)
    mtp = mtp_engine(models, 3, prompts=prompts, own_tables=False)
    expected = greedy_outputs(plain_engine(models), prompts, MAX_NEW)
    assert greedy_outputs(mtp.engine, prompts, MAX_NEW) == expected


def test_multi_layer_mtp_sampling_is_seeded_and_with_top_k_1_it_is_greedy(
    mtp_models: ModelCache,
) -> None:
    models = mtp_models("deepseek-mla")
    prompts = prompts_for([3, 7, 1], seed=50)
    expected = greedy_outputs(plain_engine(models), prompts, MAX_NEW)
    top1 = mtp_engine(models, 3).engine.generate(prompts, MAX_NEW, temperature=2.0, top_k=1, seed=3)
    assert [r.output_ids for r in top1] == expected
    sampled = [
        [
            r.output_ids
            for r in mtp_engine(models, 3).engine.generate(
                prompts, MAX_NEW, temperature=1.0, top_p=0.9, seed=5
            )
        ]
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1] != expected


def test_multi_layer_mtp_on_the_triton_backend_is_lossless(
    mtp_models: ModelCache, device: torch.device
) -> None:
    requires_triton(device)
    models = mtp_models("llama", device)
    prompts = prompts_for([4, 1], seed=4)
    expected = greedy_outputs(plain_engine(models, backend="triton"), prompts, 6)
    mtp = mtp_engine(models, 2, prompts=prompts, backend="triton")
    assert greedy_outputs(mtp.engine, prompts, 6) == expected


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bucketed_mtp_steps_emit_what_unpadded_steps_emit(
    mtp_models: ModelCache, device: torch.device, temperature: float
) -> None:
    """Padding (and on CUDA graph replay) changes no token, on the fixed-width extend and, while
    a one-token prompt is short of S − 1 committed tokens, on the ragged one."""
    models = mtp_models("deepseek-mla", device)
    backend = "triton" if device.type == "cuda" else "torch"
    prompts = prompts_for([1, 7, 3, 12, 5], seed=90)
    params = [SamplingParams(10, temperature=temperature, seed=i) for i in range(len(prompts))]

    def outputs(engine: Engine) -> list[list[int]]:
        requests = [engine.submit(p, q) for p, q in zip(prompts, params, strict=True)]
        while engine.has_work():
            engine.step()
        return [r.output_ids for r in requests]

    expected = outputs(mtp_engine(models, 3, backend=backend).engine)
    bucketed = mtp_engine(
        models, 3, backend=backend, graph_buckets=(2, 4, 8), use_cuda_graphs=device.type == "cuda"
    )
    assert outputs(bucketed.engine) == expected
    if device.type == "cuda":
        assert bucketed.worker.step_runner.num_replays > 0
