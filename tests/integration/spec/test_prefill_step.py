"""``prefill_step = "alone"`` against ``"with_decode"``: a plan that admits requests runs only
their prefills, the running ones wait one step, and every request still emits the same tokens —
greedy and seeded, for the plain, the v2 tree and the multi-layer MTP worker with overlap off
and on, and for the synchronous v1 tree worker, requests arriving while others decode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.random_checkpoint_config import sizes_with
from eagletree.app.composition.container import build_engine
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.scheduler import PrefillStep
from eagletree.app.engine.worker import StepOutput
from eagletree.domain.request import RequestStatus
from eagletree.domain.sampling import SamplingParams
from tests.integration.spec.eagle_v1.engines import v1_engine
from tests.integration.spec.eagle_v2.engines import random_checkpoints
from tests.integration.spec.harness import (
    SIZES,
    SpecModels,
    load_spec_models,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)
from tests.integration.spec.multi_layer_mtp.engines import NUM_LAYERS, mtp_engine

NUM_REQUESTS = 7
ARRIVAL_EVERY = 2  # steps between two submits after the first three
PROMPT_LENGTHS = [3, 7, 1, 12, 5, 9, 4]

# (prefills, decodes, paused) of every plan a worker ran
PlanShape = tuple[int, int, int]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], SpecModels]:
    cache: dict[str, SpecModels] = {}

    def get(worker: str) -> SpecModels:
        kind = "mtp" if worker == "mtp" else "eagle"  # one EAGLE checkpoint for the others
        if kind not in cache:
            root = tmp_path_factory.mktemp(kind)
            if kind == "mtp":
                sizes = sizes_with(SIZES, num_mtp_layers=NUM_LAYERS["deepseek-mla"])
                cache[kind] = load_spec_models(
                    root, "deepseek-mla", "mtp", torch.device("cpu"), sizes=sizes
                )
            else:
                cache[kind] = load_spec_models(root, "llama", "eagle", torch.device("cpu"))
        return cache[kind]

    return get


def engine_for(
    models: Callable[[str], SpecModels], worker: str, overlap: bool, prefill_step: PrefillStep
) -> Engine:
    loaded = models(worker)
    if worker == "plain":
        return plain_engine(loaded, max_running=4, overlap=overlap, prefill_step=prefill_step)
    if worker == "v1":  # it frees rejected slots on the host every step: never overlapped
        return v1_engine(loaded, (3, 2, 4), max_running=4, prefill_step=prefill_step).engine
    if worker == "mtp":  # prompts of 1 token are shorter than S − 1 = 2: ragged first steps
        return mtp_engine(
            loaded, 3, max_running=4, overlap=overlap, prefill_step=prefill_step
        ).engine
    return speculative_engine(
        loaded, 3, 2, 4, max_running=4, overlap=overlap, prefill_step=prefill_step
    ).engine


def record_plans(engine: Engine) -> list[PlanShape]:
    """Wrap the engine's worker so that every plan it runs is recorded."""
    worker = engine.worker
    step: Callable[[SchedulePlan], StepOutput] = worker.step
    shapes: list[PlanShape] = []

    def recording(plan: SchedulePlan) -> StepOutput:
        shapes.append((len(plan.prefill), len(plan.decode), len(plan.paused)))
        return step(plan)

    worker.step = recording  # type: ignore[method-assign]
    return shapes


def run_arrivals(engine: Engine, temperature: float) -> list[Any]:
    """Three requests at once, then one more every ``ARRIVAL_EVERY`` steps while they decode
    (with ``max_new_tokens`` 4 + 3·i mod 13, so that they finish at different steps); returns
    each one's tokens and finish reason."""
    prompts = ragged_prompts(SIZES.vocab_size, PROMPT_LENGTHS, seed=19)

    def submit(i: int) -> Any:
        params = SamplingParams(4 + (3 * i) % 13, temperature=temperature, top_p=0.9, seed=i)
        return engine.submit(prompts[i], params)

    requests = [submit(i) for i in range(3)]
    steps = 0
    while len(requests) < NUM_REQUESTS or engine.has_work():
        engine.step()
        steps += 1
        if len(requests) < NUM_REQUESTS and steps % ARRIVAL_EVERY == 0:
            requests.append(submit(len(requests)))
        assert steps < 500, "no progress"
    engine.step()  # reads the step in flight, if any
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    return [(r.output_ids, r.finish_reason) for r in requests]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
@pytest.mark.parametrize(
    ("worker", "overlap"),
    [(w, o) for w in ("plain", "v2", "mtp") for o in (False, True)] + [("v1", False)],
    ids=lambda value: {False: "sync", True: "overlap"}.get(value, value),
)
def test_a_prefill_alone_emits_what_a_prefill_beside_the_decode_batch_emits(
    models: Callable[[str], SpecModels], worker: str, overlap: bool, temperature: float
) -> None:
    runs, shapes, engines = [], [], []
    for prefill_step in ("with_decode", "alone"):
        engine = engine_for(models, worker, overlap, prefill_step)
        shapes.append(record_plans(engine))
        runs.append(run_arrivals(engine, temperature))
        allocator = engine.scheduler.allocator
        assert allocator.available_size() == allocator.size
        engines.append(engine)
    beside, alone = shapes
    # the arrivals did join running requests: with_decode ran them in one step
    assert sum(p > 0 and d > 0 for p, d, _ in beside) >= 3
    assert all(paused == 0 for _, _, paused in beside)
    # alone: no plan with prefills decodes; the running requests sat those steps out
    assert all(d == 0 for p, d, _ in alone if p > 0)
    assert sum(p > 0 and paused > 0 for p, _, paused in alone) >= 3
    lone_prefills = sum(p > 0 for p, _, _ in alone)
    assert engines[1].stats.num_prefill_only_steps == lone_prefills
    if overlap:
        for engine in engines:
            assert engine.stats.num_steps_ahead > engine.stats.num_steps // 2
    assert runs[0] == runs[1]
    assert len({len(out) for out, _ in runs[0]}) > 3  # they finished at different steps


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("worker", ["plain", "v2"])
def test_under_retraction_a_prefill_alone_keeps_the_greedy_tokens_and_frees_every_slot(
    models: Callable[[str], SpecModels], worker: str, overlap: bool
) -> None:
    """A pool too small for the batch: requests are retracted and readmitted (prefilled alone
    again), and the greedy tokens stay the with_decode ones."""
    loaded = models(worker)
    prompts = ragged_prompts(SIZES.vocab_size, [*PROMPT_LENGTHS, 6], seed=41)
    runs = []
    for prefill_step in ("with_decode", "alone"):
        if worker == "plain":  # 60 slots: one request fits (≤ 12 + 16 + 2), eight do not
            engine = plain_engine(loaded, pool_size=60, overlap=overlap, prefill_step=prefill_step)
        else:  # 100 slots: one request fits (≤ 12 + 16 tokens + 16 reserved), eight do not
            engine = speculative_engine(
                loaded, 3, 2, 4, pool_size=100, overlap=overlap, prefill_step=prefill_step
            ).engine
        results = engine.generate(prompts, 16)
        runs.append([(r.output_ids, r.finish_reason) for r in results])
        assert engine.stats.num_retracted > 0
        allocator = engine.scheduler.allocator
        assert allocator.available_size() == allocator.size
    assert engine.stats.num_prefill_only_steps > 0
    assert runs[0] == runs[1]


def test_settings_carry_prefill_step_to_the_scheduler(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.config.settings import EngineSettings

    target_path, _ = random_checkpoints(tmp_path, "llama", "eagle")
    prompts = ragged_prompts(SIZES.vocab_size, [5, 2, 8], seed=3)
    outputs = []
    for prefill_step in ("with_decode", "alone"):
        settings = EngineSettings(
            model={"target_path": target_path, "device": "cpu", "dtype": "float32"},
            backend={"attention": "torch", "kv_move": "torch"},
            memory={"max_total_tokens": 512, "max_running_requests": 2},
            scheduler={"prefill_step": prefill_step},
        )
        engine = build_engine(settings)
        assert engine.scheduler.prefill_step == prefill_step
        outputs.append([r.output_ids for r in engine.generate(prompts, 6)])
    assert outputs[0] == outputs[1]
