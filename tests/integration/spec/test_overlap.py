"""The engine's overlap mode (one step in flight) against the synchronous loop: identical tokens
for every v2 worker and target kind and for the plain worker, greedy and seeded sampling, stops
at every position of an accepted path (and of a plain output), and no slot or row left behind
by 1,000 random requests with aborts and retracts. Every v2 / MTP-v2 and plain step here runs
under the sync tripwire (``tests/integration/conftest.py``), a v2 one strictly so when it is
launched ahead of the host (a plain step launched ahead has exact host lengths)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.random_checkpoint_config import ModelSizes, sizes_with
from eagletree.app.composition.container import build_engine
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.reports import GenerationResult
from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.domain.request import FinishReason, Request, RequestStatus
from eagletree.domain.sampling import SamplingParams
from eagletree.domain.tree import TreeMaskMode
from tests.conftest import requires_cuda
from tests.integration.spec.eagle_v2.engines import oracle_engine, random_checkpoints
from tests.integration.spec.harness import (
    SIZES,
    SpecModels,
    greedy_outputs,
    load_spec_models,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)
from tests.integration.spec.multi_layer_mtp.engines import NUM_LAYERS, mtp_engine
from tests.sync_tripwire import HostSyncError, no_host_sync

ModelCache = Callable[..., SpecModels]
MODELS = [
    ("llama", "eagle"),
    ("llama", "eagle3"),
    ("deepseek-mla", "eagle"),
    ("deepseek-mla", "eagle3"),
]
CONFIGS = [(3, 1, 4), (5, 4, 8)]  # (S, k, N): a chain and a tree
PROMPT_LENGTHS = [3, 7, 1, 12, 5, 9]
MAX_NEW = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    cache: dict[tuple[str, str, str, str], SpecModels] = {}

    def get(arch: str, kind: str, sizes: ModelSizes = SIZES, device: str = "cpu") -> SpecModels:
        key = (arch, kind, repr(sizes), device)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{kind}")
            cache[key] = load_spec_models(root, arch, kind, torch.device(device), sizes=sizes)  # type: ignore[arg-type]
        return cache[key]

    return get


def prompts_for(batch_size: int, seed: int) -> list[list[int]]:
    lengths = [PROMPT_LENGTHS[(seed + i) % len(PROMPT_LENGTHS)] for i in range(batch_size)]
    return ragged_prompts(SIZES.vocab_size, lengths, seed)


def summary(results: Sequence[GenerationResult], acceptance: bool = True) -> list[tuple[Any, ...]]:
    """What must not depend on overlap: tokens, finish reasons, per-step acceptance (unless
    the draft draws from a generator of its own, whose draws depend on the batches)."""
    return [
        (
            r.output_ids,
            r.finish_reason,
            r.acceptance.histogram if r.acceptance and acceptance else None,
        )
        for r in results
    ]


def assert_ran_ahead(engine: Engine) -> None:
    """The overlapped engine really launched steps before reading their predecessors."""
    assert engine.overlap and engine.stats.num_steps_ahead > engine.stats.num_steps // 2


# -- tokens equal the synchronous loop's ----------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "S{}k{}N{}".format(*c))
@pytest.mark.parametrize("model", MODELS, ids=lambda m: "-".join(m))
@pytest.mark.parametrize("buckets", [(), (2, 4, 8)], ids=["eager", "padded"])
def test_overlapped_v2_steps_emit_what_synchronous_ones_emit(
    models: ModelCache,
    model: tuple[str, str],
    config: tuple[int, int, int],
    buckets: tuple[int, ...],
) -> None:
    loaded = models(*model)
    prompts = prompts_for(6, seed=sum(config))
    expected = greedy_outputs(plain_engine(loaded), prompts, MAX_NEW)
    runs = []
    for overlap in (False, True):
        spec = speculative_engine(loaded, *config, graph_buckets=buckets, overlap=overlap)
        results = spec.engine.generate(prompts, MAX_NEW)
        assert [r.output_ids for r in results] == expected
        runs.append(summary(results))
        assert spec.memory.allocator.available_size() == spec.memory.allocator.size
    assert_ran_ahead(spec.engine)
    assert runs[0] == runs[1]


def test_without_a_step_in_flight_the_host_lengths_are_the_devices(models: ModelCache) -> None:
    """The device's committed lengths drive the steps; the host's drive windows and releases."""
    loaded = models("llama", "eagle")
    spec = speculative_engine(loaded, 5, 4, 8)
    for prompt in prompts_for(4, seed=8):
        spec.engine.submit(prompt, SamplingParams(MAX_NEW))
    committed = spec.worker.step_runner.buffers.committed
    assert committed is not None
    num_checked = 0
    while spec.engine.has_work():
        spec.engine.step()
        for request in spec.engine.scheduler.running:
            assert request.row is not None
            assert int(committed[request.row]) == request.committed_len, request
            num_checked += 1
    assert num_checked > 10


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_overlapped_seeded_sampling_draws_the_synchronous_samples(
    models: ModelCache, temperature: float
) -> None:
    loaded = models("llama", "eagle3")
    prompts = prompts_for(5, seed=7)
    runs = []
    for overlap in (False, True):
        spec = speculative_engine(loaded, 5, 4, 8, overlap=overlap)
        results = spec.engine.generate(
            prompts, MAX_NEW, temperature=temperature, top_p=0.9, seed=11
        )
        runs.append(summary(results))
    assert_ran_ahead(spec.engine)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("oracle", [False, True], ids=["random", "oracle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_overlapped_mtp_steps_emit_what_synchronous_ones_emit(
    models: ModelCache, oracle: bool, temperature: float
) -> None:
    loaded = models(
        "deepseek-mla", "mtp", sizes_with(SIZES, num_mtp_layers=NUM_LAYERS["deepseek-mla"])
    )
    # prompts of 1 and 2 tokens are shorter than S − 1 = 2: their first steps are ragged, which
    # the engine runs only from exact lengths (it reads the step in flight first)
    prompts = ragged_prompts(SIZES.vocab_size, [1, 2, 9, 4, 12], seed=5)
    expected = greedy_outputs(plain_engine(loaded), prompts, MAX_NEW)
    runs = []
    for overlap in (False, True):
        mtp = mtp_engine(loaded, 3, prompts=prompts if oracle else (), overlap=overlap)
        results = mtp.engine.generate(prompts, MAX_NEW, temperature=temperature, seed=2)
        if temperature == 0.0:
            assert [r.output_ids for r in results] == expected
        # the layer oracle's deliberate errors come from its own generator: not compared
        runs.append(summary(results, acceptance=not oracle))
        assert mtp.allocator.available_size() == mtp.allocator.size
    assert_ran_ahead(mtp.engine)
    assert runs[0] == runs[1]


def test_a_full_tree_mask_never_runs_ahead_and_still_emits_the_same_tokens(
    models: ModelCache,
) -> None:
    loaded = models("llama", "eagle")
    prompts = prompts_for(3, seed=3)
    runs = []
    for overlap in (False, True):
        spec = speculative_engine(
            loaded, 3, 2, 6, mask_mode=TreeMaskMode.FULL_MASK, overlap=overlap
        )
        runs.append(summary(spec.engine.generate(prompts, MAX_NEW)))
    assert spec.engine.stats.num_steps_ahead == 0  # its mask is sized from Σ L_b on the host
    assert runs[0] == runs[1]


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


# -- stops inside an accepted path -----------------------------------------------------------


@pytest.mark.parametrize("stop", ["stop", "eos", "length"])
@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_stops_at_every_position_of_an_accepted_path_cut_it_as_the_synchronous_loop_does(
    models: ModelCache, stop: str, worker: str
) -> None:
    loaded = models("llama", "eagle")
    # a chain oracle emits exactly S + 1 = 4 tokens per verify step: 1 | 2..5 | 6..9 | 10..13
    config = (3, 1, 4)
    [prompt] = prompts_for(1, seed=31)
    _, _, [reference] = oracle_engine(loaded, config, [prompt], 14)

    def engine_for(eos: tuple[int, ...], overlap: bool) -> Engine:
        if worker == "plain":  # one token a step: a stop at any step of the run
            return plain_engine(loaded, eos_token_ids=eos, overlap=overlap)
        spec, _, _ = oracle_engine(loaded, config, [prompt], 14, eos_token_ids=eos, overlap=overlap)
        return spec.engine

    for cut in range(1, 10):  # the first token of a path, its middle ones, its last
        if stop != "length" and reference[cut] in reference[:cut]:
            continue  # an earlier copy of the token would stop first
        token = reference[cut]
        eos = (token,) if stop == "eos" else ()
        stop_ids = [token] if stop == "stop" else None
        max_new = cut + 1 if stop == "length" else 14
        outcomes = []
        for overlap in (False, True):
            engine = engine_for(eos, overlap)
            [result] = engine.generate([prompt], max_new, stop_token_ids=stop_ids)
            outcomes.append(summary([result]))
            assert result.output_ids == reference[: cut + 1]
            engine.close()  # reads the step launched past the finish: its tokens dropped
            # the step launched ahead of the finish wrote KV into the window only: every slot
            # and the row go back exactly once (the allocator checks double frees)
            allocator = engine.scheduler.allocator
            assert allocator.available_size() == allocator.size
            assert engine.scheduler.req_to_token_pool.req_to_token.eq(0).all()
        assert_ran_ahead(engine)
        assert outcomes[0] == outcomes[1]
        expected = {"stop": FinishReason.STOP, "eos": FinishReason.EOS}.get(
            stop, FinishReason.LENGTH
        )
        assert outcomes[1][0][1] is expected


# -- no leak ------------------------------------------------------------------------------------

TINY = ModelSizes(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    max_position_embeddings=256,
    draft_vocab_size=32,
)


@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_a_thousand_random_requests_with_aborts_and_retracts_leave_no_slot_or_row_behind(
    models: ModelCache, worker: str
) -> None:
    loaded = models("llama", "eagle", TINY)
    if worker == "plain":  # a request needs up to 24 + 16 + 2 = 42 slots; eight do not fit
        engine = plain_engine(loaded, pool_size=60, max_running=8, overlap=True)
    else:  # 90 slots: a request needs up to 24 + 16 + 2·max(S·k, N) = 48; eight do not fit
        engine = speculative_engine(
            loaded, 2, 2, 4, pool_size=90, max_running=8, overlap=True
        ).engine
    allocator, table = engine.scheduler.allocator, engine.scheduler.req_to_token_pool
    free_at_start, rows_at_start = allocator.available_size(), table.req_to_token.clone()
    generator = torch.Generator().manual_seed(12)

    def randint(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=generator))

    submitted: list[Request] = []
    aborted: set[int] = set()
    while len(submitted) < 1000 or engine.has_work():
        for _ in range(randint(0, 4) if len(submitted) < 1000 else 0):
            prompt = torch.randint(0, TINY.vocab_size, (randint(1, 25),), generator=generator)
            params = SamplingParams(
                randint(1, 17), temperature=float(randint(0, 2)), seed=len(submitted)
            )
            submitted.append(engine.submit(prompt.tolist(), params))
        if randint(0, 6) == 0:  # a queued, running, finishing or finished request
            victim = submitted[randint(0, len(submitted))]
            if engine.abort(victim.request_id):
                aborted.add(victim.request_id)
        engine.step()
    engine.step()  # reads the last step in flight (its tokens are all dropped)
    assert engine.stats.num_retracted > 10 and len(aborted) > 50
    assert_ran_ahead(engine)
    assert allocator.available_size() == free_at_start
    assert torch.equal(table.req_to_token, rows_at_start)
    assert table.available_size() == table.size
    for request in submitted:
        assert request.status is RequestStatus.FINISHED
        assert (request.finish_reason is FinishReason.ABORT) == (request.request_id in aborted)
        if request.request_id not in aborted:
            assert len(request.output_ids) == request.params.max_new_tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_under_retraction_greedy_tokens_match_and_seeded_samples_repeat(
    models: ModelCache, worker: str, temperature: float
) -> None:
    """A retracted request is prefilled again, which draws one coin where a verify step draws
    N + 1, so its later samples depend on the step it was retracted at; the overlapped engine
    decides retraction from lower bounds, possibly a step later. Greedy tokens do not depend on
    it, and seeded samples still repeat run after run. (A plain decode step draws one coin, as
    a prefill does, so its samples do not depend on retraction at all.)"""
    loaded = models("llama", "eagle")
    prompts = prompts_for(8, seed=41)
    runs = []
    for overlap in (False, True, True):
        if worker == "plain":  # 60 slots: one request fits (≤ 12 + 16 + 2), eight do not
            engine = plain_engine(loaded, pool_size=60, max_running=8, overlap=overlap)
        else:  # 100 slots: one request fits (≤ 12 + 16 tokens + 16 reserved), eight do not
            engine = speculative_engine(
                loaded, 3, 2, 4, pool_size=100, max_running=8, overlap=overlap
            ).engine
        results = engine.generate(prompts, MAX_NEW, temperature=temperature, seed=9)
        runs.append([(r.output_ids, r.finish_reason) for r in results])
        assert engine.stats.num_retracted > 0
        assert engine.scheduler.allocator.available_size() == engine.scheduler.allocator.size
    assert_ran_ahead(engine)
    assert runs[1] == runs[2]
    if temperature == 0.0 or worker == "plain":
        assert runs[0] == runs[1]


# -- the tripwire -------------------------------------------------------------------------------


@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_the_tripwire_catches_a_read_back_inside_a_step(
    models: ModelCache, monkeypatch: pytest.MonkeyPatch, worker: str
) -> None:
    loaded = models("llama", "eagle")
    prompts = prompts_for(2, seed=1)
    worker_class = NonSpeculativeWorker if worker == "plain" else EagleWorkerV2
    name = "_decode_on_device" if worker == "plain" else "_decode_as"  # what the runner runs
    decode = getattr(worker_class, name)

    def reads_back(self: Any, *args: Any) -> tuple[torch.Tensor, ...]:
        args[-1].seq_lens.max().item()  # what the tripwire is for (the last: the inputs)
        result: tuple[torch.Tensor, ...] = decode(self, *args)
        return result

    monkeypatch.setattr(worker_class, name, reads_back)
    if worker == "plain":
        engine = plain_engine(loaded, overlap=True)
    else:
        engine = speculative_engine(loaded, 3, 1, 4).engine
    with pytest.raises(HostSyncError, match=r"Tensor\.item"):
        engine.generate(prompts, MAX_NEW)


def test_the_strict_tripwire_catches_int_of_a_tensor_and_the_plain_one_allows_it() -> None:
    lens = torch.tensor([3, 4])
    with no_host_sync():
        assert int(lens.sum()) == 7  # a host copy's sum: allowed while lengths are exact
        with pytest.raises(HostSyncError, match=r"Tensor\.__bool__"):
            _ = bool(lens.any())
    with no_host_sync(strict=True), pytest.raises(HostSyncError, match=r"Tensor\.__int__"):
        int(lens.sum())
    assert lens.sum().item() == 7  # disarmed again


# -- on CUDA: graph replays overlapped, and no sync in a step launched ahead ----------------------

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
