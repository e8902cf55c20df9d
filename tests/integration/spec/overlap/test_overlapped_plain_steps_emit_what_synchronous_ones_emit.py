"""The plain worker one step ahead: the same tokens as on the host, synchronously or
overlapped, with requests joining mid-run; its device tokens equal the host's between
steps; without run_ahead it never runs ahead; the container turns run_ahead on with
overlap. (A plain step launched ahead has exact host lengths.)"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from eagletree.app.composition.container import build_engine
from eagletree.app.engine.loop import Engine
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.domain.sampling import SamplingParams
from tests.integration.spec.eagle_v2.engines import random_checkpoints
from tests.integration.spec.harness import plain_engine
from tests.integration.spec.overlap.runs import MAX_NEW, ModelCache, assert_ran_ahead, prompts_for


def run_submitted(engine: Engine, prompts: Sequence[Sequence[int]], **params: Any) -> list[Any]:
    """Submit one request per prompt, the i-th with ``max_new_tokens`` 4 + 3·i mod 13 (so that
    they finish at different steps and the queued ones join running ones mid-run), and run
    them all; returns each one's tokens and finish reason."""
    requests = [
        engine.submit(prompt, SamplingParams(4 + (3 * i) % 13, seed=i, **params))
        for i, prompt in enumerate(prompts)
    ]
    while engine.has_work():
        engine.step()
    engine.step()  # reads the step in flight, if any
    return [(r.output_ids, r.finish_reason) for r in requests]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("buckets", [(), (2, 4)], ids=["eager", "padded"])
def test_overlapped_plain_steps_emit_what_synchronous_ones_emit(
    models: ModelCache, buckets: tuple[int, ...], temperature: float
) -> None:
    """Four requests run at a time, seven in all: prefills join decodes while a step is in
    flight. The reference keeps its pending tokens on the host; the other two runs take them
    from the device table, synchronously and one step ahead."""
    loaded = models("llama", "eagle")
    prompts = prompts_for(7, seed=23)
    runs, engines = [], []
    for overlap, run_ahead in ((False, False), (False, True), (True, True)):
        engine = plain_engine(
            loaded, max_running=4, graph_buckets=buckets, overlap=overlap, run_ahead=run_ahead
        )
        runs.append(run_submitted(engine, prompts, temperature=temperature, top_p=0.9))
        assert engine.scheduler.allocator.available_size() == engine.scheduler.allocator.size
        engines.append(engine)
    assert engines[0].stats.num_steps_ahead == engines[1].stats.num_steps_ahead == 0
    assert_ran_ahead(engines[2])
    assert len({len(out) for out, _ in runs[0]}) > 3  # they did finish at different steps
    assert runs[0] == runs[1] == runs[2]


def test_without_a_step_in_flight_the_device_tokens_are_the_hosts(models: ModelCache) -> None:
    """The plain worker's device table holds every running request's pending token."""
    engine = plain_engine(models("llama", "eagle"), max_running=3, run_ahead=True)
    worker = engine.worker
    assert isinstance(worker, NonSpeculativeWorker)
    pending = worker.step_runner.buffers.pending_tokens
    assert pending is not None
    for i, prompt in enumerate(prompts_for(5, seed=2)):
        engine.submit(prompt, SamplingParams(3 + 2 * i, temperature=1.0, seed=i))
    num_checked = 0
    while engine.has_work():
        engine.step()
        for request in engine.scheduler.running:
            assert request.row is not None
            assert int(pending[request.row]) == request.last_token, request
            num_checked += 1
    assert num_checked > 10


def test_a_plain_worker_without_run_ahead_never_runs_ahead(models: ModelCache) -> None:
    engine = plain_engine(models("llama", "eagle"), overlap=True, run_ahead=False)
    engine.generate(prompts_for(3, seed=4), MAX_NEW)
    assert engine.stats.num_steps_ahead == 0  # its pending tokens come from the host


def test_settings_with_overlap_on_run_the_plain_worker_ahead(tmp_path: Path) -> None:
    """The container gives the plain worker ``run_ahead`` exactly when the engine overlaps."""
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.config.settings import EngineSettings

    target_path, _ = random_checkpoints(tmp_path, "llama", "eagle")
    model = {"target_path": target_path, "device": "cpu", "dtype": "float32"}
    backend = {"attention": "torch", "kv_move": "torch"}
    memory = {"max_total_tokens": 1024, "max_running_requests": 4}
    prompts = prompts_for(5, seed=6)
    runs = []
    for overlap in ("off", "on"):
        settings = EngineSettings(
            model=model, backend=backend, memory=memory, scheduler={"overlap": overlap}
        )
        engine = build_engine(settings)
        assert engine.overlap is (overlap == "on")
        assert engine.worker.reserve_per_step == (2 if overlap == "on" else 1)
        runs.append([r.output_ids for r in engine.generate(prompts, MAX_NEW)])
    assert_ran_ahead(engine)
    assert runs[0] == runs[1]
