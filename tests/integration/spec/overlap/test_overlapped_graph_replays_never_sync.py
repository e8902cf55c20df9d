"""On CUDA: overlapped CUDA graph replays emit what synchronous ones emit, and a step
launched ahead never synchronises with the host (v2, MTP and the plain worker)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eagletree.adapters.models.random_checkpoint_config import sizes_with
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from tests.conftest import requires_cuda
from tests.integration.spec.harness import SIZES, plain_engine, speculative_engine
from tests.integration.spec.multi_layer_mtp.engines import NUM_LAYERS, mtp_engine
from tests.integration.spec.overlap.runs import (
    MAX_NEW,
    ModelCache,
    assert_ran_ahead,
    prompts_for,
    summary,
)

GRAPH_BUCKETS = (1, 2, 4, 8)


def cuda_engine(models: ModelCache, worker: str, overlap: bool) -> Engine:
    """A Triton engine replaying CUDA graphs (greedy graphs captured now)."""
    if worker == "plain":
        engine = plain_engine(
            models("llama", "eagle3", device="cuda"),
            backend="triton",
            graph_buckets=GRAPH_BUCKETS,
            use_cuda_graphs=True,
            overlap=overlap,
        )
        plain = engine.worker
        assert isinstance(plain, NonSpeculativeWorker)
        plain.capture_graphs()
        return engine
    if worker == "mtp":
        sizes = sizes_with(SIZES, num_mtp_layers=NUM_LAYERS["deepseek-mla"])
        loaded = models("deepseek-mla", "mtp", sizes, device="cuda")
        mtp = mtp_engine(
            loaded,
            3,
            backend="triton",
            graph_buckets=GRAPH_BUCKETS,
            use_cuda_graphs=True,
            overlap=overlap,
        )
        mtp.worker.capture_graphs()
        return mtp.engine
    loaded = models("llama", "eagle3", device="cuda")
    spec = speculative_engine(
        loaded,
        5,
        4,
        8,
        backend="triton",
        graph_buckets=GRAPH_BUCKETS,
        use_cuda_graphs=True,
        overlap=overlap,
    )
    spec.worker.capture_graphs()
    return spec.engine


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("worker", ["v2", "mtp", "plain"])
def test_overlapped_graph_replays_emit_what_synchronous_ones_emit(
    models: ModelCache, worker: str, temperature: float
) -> None:
    """The replay of step i + 1 overwrites the graph's outputs: step i's must have been copied
    out before it, in stream order."""
    prompts = prompts_for(6, seed=13)
    runs = []
    for overlap in (False, True):
        engine = cuda_engine(models, worker, overlap)
        runs.append(summary(engine.generate(prompts, MAX_NEW, temperature=temperature, seed=4)))
    assert_ran_ahead(engine)
    assert runs[0] == runs[1]


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("worker", ["v2", "mtp", "plain"])
def test_a_step_launched_ahead_never_synchronises_with_the_host(
    models: ModelCache, worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = cuda_engine(models, worker, overlap=True)
    worker_class = type(engine.worker)
    step = worker_class.step
    checked = []

    def guarded(self: Any, plan: SchedulePlan) -> Any:
        if plan.exact_lengths:
            return step(self, plan)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(self, plan)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            checked.append(len(plan.decode))

    monkeypatch.setattr(worker_class, "step", guarded)
    engine.generate(prompts_for(5, seed=17), MAX_NEW)
    assert len(checked) > 3 and max(checked) == 5
