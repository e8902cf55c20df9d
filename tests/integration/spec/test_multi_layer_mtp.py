"""MultiLayerEagleWorkerV2 end to end: greedy losslessness over DeepSeek-MLA and Llama targets with
several MTP layers; the regression test for upstream's per-step pool bug (each layer's pool holds
exactly that layer's KV, equal to a clean recomputation, and no other pool is written); idle
steps; retract and abort without leaks; argument checks."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.random_checkpoint_config import sizes_with
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.app.composition.container import build_engine
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.scheduler import PrefillStep
from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.model_output import ModelOutput
from eagletree.domain.request import FinishReason
from eagletree.domain.sampling import SamplingParams
from eagletree.ports.attention import AttentionBackend
from eagletree.ports.memory import KVPool, ReqToTokenPool
from eagletree.ports.model import DraftRunner
from tests.batch_widths import fixed_width
from tests.conftest import requires_cuda, requires_triton
from tests.integration.models.harness import Memory, Requests, make_backend, make_pool
from tests.integration.spec.harness import (
    CONTEXT_LEN,
    SIZES,
    SpecModels,
    greedy_outputs,
    load_spec_models,
    plain_engine,
    ragged_prompts,
)

NUM_LAYERS = {"deepseek-mla": 3, "llama": 2}
WRONG_RATE = 0.2  # the layer oracle's share of deliberately wrong drafts
MAX_NEW = 16
# Every KV row starts as this; finite, because the reference attention multiplies masked-out
# rows by an exact 0 (NaN would leak through). No layer computes it by chance.
POISON = 12345.0

ModelCache = Callable[..., SpecModels]


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread() -> Iterator[None]:
    """Tiny matrices: one thread is ~50x faster than two on a shared two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def mtp_models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    cache: dict[tuple[str, str], SpecModels] = {}

    def get(arch: str, device: torch.device | str = "cpu") -> SpecModels:
        key = (arch, str(device))
        if key not in cache:
            sizes = sizes_with(SIZES, num_mtp_layers=NUM_LAYERS[arch])
            root = tmp_path_factory.mktemp(f"{arch}-mtp")
            cache[key] = load_spec_models(root, arch, "mtp", torch.device(device), sizes=sizes)  # type: ignore[arg-type]
        return cache[key]

    return get


class LayerOracle:
    """MTP layer ``layer`` as a DraftRunner that knows the target's greedy continuation.

    The real forward runs (its KV is what the pool gets, untouched); then a logits row whose
    input token is the true token ``layer + 1`` places after its position proposes the true
    token after that, except for a seeded ``WRONG_RATE`` share that proposes a wrong one, so
    acceptance is deep but not always full and the boundary rows see wrong drafts.
    """

    HOST_STAND_IN = True  # it reads the batch on the host: exempt from the sync tripwire

    def __init__(
        self,
        inner: DraftModelRunner,
        layer: int,
        sequence_of_row: Callable[[int], Sequence[int]],
        seed: int,
    ) -> None:
        self._inner = inner
        self._layer = layer
        self._sequence_of_row = sequence_of_row
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def kv_pool(self) -> KVPool:
        return self._inner.kv_pool

    @property
    def req_to_token_pool(self) -> ReqToTokenPool:
        return self._inner.req_to_token_pool

    @property
    def attention_backend(self) -> AttentionBackend:
        return self._inner.attention_backend

    @property
    def vocab_size(self) -> int:
        return self._inner.vocab_size

    @property
    def hidden_size(self) -> int:
        return self._inner.hidden_size

    def forward(
        self,
        batch: ForwardBatch,
        hidden_states: torch.Tensor,
        logits_rows: torch.Tensor | None = None,
    ) -> ModelOutput:
        out = self._inner.forward(batch, hidden_states, logits_rows)
        assert logits_rows is not None
        if batch.mode is ForwardMode.EXTEND:  # prefill, or a step with a short request
            assert batch.extend_lens is not None
            owners = torch.repeat_interleave(batch.req_pool_indices, batch.extend_lens).tolist()
        else:  # the fixed-width draft extend: S − 1 + N rows per request
            assert batch.mode is ForwardMode.DRAFT_EXTEND
            width = fixed_width(batch)
            owners = torch.repeat_interleave(batch.req_pool_indices, width).tolist()
        ids, positions = batch.input_ids.tolist(), batch.positions.tolist()
        logits = out.logits.clone()
        for i, row in enumerate(logits_rows.tolist()):
            sequence = self._sequence_of_row(owners[row])
            read = positions[row] + self._layer + 1  # the index of the token this row reads
            if read + 1 < len(sequence) and ids[row] == sequence[read]:
                token = sequence[read + 1]
                if float(torch.rand(1, generator=self._generator)) < WRONG_RATE:
                    token = (token + 1) % self.vocab_size
                logits[i] = -20.0
                logits[i, token] = 20.0
        return ModelOutput(logits=logits, hidden_states=out.hidden_states)


@dataclass(frozen=True, slots=True)
class MTPEngine:
    engine: Engine
    worker: MultiLayerEagleWorkerV2
    target: TargetModelRunner
    layer_pools: list[KVPool]  # the pool each layer should write
    drafts: list[DraftRunner]  # what the worker runs, layer by layer
    allocator: DeviceSlotAllocator
    table: TensorReqToTokenPool


def mtp_engine(
    models: SpecModels,
    num_steps: int,
    *,
    prompts: Sequence[Sequence[int]] = (),
    own_tables: bool = True,
    first_runners_pool: bool = False,
    pool_size: int = 2048,
    max_running: int = 8,
    backend: str = "torch",
    graph_buckets: Sequence[int] = (),
    use_cuda_graphs: bool = False,
    overlap: bool = False,
    prefill_step: PrefillStep = "with_decode",
) -> MTPEngine:
    """An engine over ``num_steps`` MTP layers, each runner with its own KV pool (and its own
    req_to_token pool when ``own_tables``). With ``prompts`` the layers are oracles of their
    greedy continuations. ``first_runners_pool`` wires every layer to layer 0's pool, table
    and backend — upstream's bug, for showing that the regression check catches it.
    ``overlap``: the engine keeps one step in flight; ``prefill_step``: the scheduler's."""
    n = num_steps + 1
    allocator = DeviceSlotAllocator(pool_size, models.device, debug_checks=True)
    width = CONTEXT_LEN + 2 * n + 4
    rows = max_running + (1 if graph_buckets else 0)  # the padding row of bucketed steps
    table = TensorReqToTokenPool(rows, width, models.device)
    target_pool = make_pool(models.target.kv_layout, pool_size, models.dtype, models.device)
    target = TargetModelRunner(
        models.target, target_pool, table, make_backend(backend, target_pool, table)
    )
    pools: list[KVPool] = []
    runners: list[DraftModelRunner] = []
    for i in range(num_steps):
        layer = models.drafts[i]
        pools.append(make_pool(layer.kv_layout, pool_size, models.dtype, models.device))
        own = TensorReqToTokenPool(rows, width, models.device) if own_tables else table
        if first_runners_pool and i > 0:
            pool, own = runners[0].kv_pool, runners[0].req_to_token_pool  # type: ignore[assignment]
            attention = runners[0].attention_backend
        else:
            pool, attention = pools[i], make_backend(backend, pools[i], own)
        runners.append(DraftModelRunner(layer, pool, own, attention))
    drafts: list[DraftRunner] = list(runners)
    holder: list[Engine] = []
    if prompts:
        continuation = greedy_outputs(plain_engine(models), prompts, 3 * MAX_NEW)
        sequences = {tuple(p): [*p, *c] for p, c in zip(prompts, continuation, strict=True)}

        def sequence_of_row(row: int) -> list[int]:
            [owner] = [r for r in holder[0].scheduler.running if r.row == row]
            return sequences[owner.prompt_ids]

        drafts = [LayerOracle(r, i, sequence_of_row, seed=i) for i, r in enumerate(runners)]
    worker = MultiLayerEagleWorkerV2(
        target,
        drafts,
        num_steps=num_steps,
        num_draft_tokens=n,
        draft_hidden_size=target.hidden_size,
        graph_buckets=graph_buckets,
        use_cuda_graphs=use_cuda_graphs,
    )
    holder.append(
        Engine(
            worker,
            allocator,
            table,
            vocab_size=target.vocab_size,
            max_context_len=CONTEXT_LEN,
            max_running_requests=max_running,
            overlap=overlap,
            prefill_step=prefill_step,
        )
    )
    return MTPEngine(holder[0], worker, target, pools, drafts, allocator, table)


def prompts_for(lengths: Sequence[int], seed: int) -> list[list[int]]:
    return ragged_prompts(SIZES.vocab_size, lengths, seed)


# -- greedy losslessness ----------------------------------------------------------------------


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


# -- regression: step i runs runner i over runner i's own pools -------------------------------


def clean_kv(
    models: SpecModels, num_steps: int, tokens: Sequence[int], committed: int
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """KV rows of the target (positions [0, L)) and of MTP layer i (positions [0, L − i))
    computed from scratch over the true ``tokens`` (L = ``committed``; ``tokens[L]`` is the
    pending bonus): layer i at position p reads token p + i + 1 and layer i − 1's output there.
    Returns per-buffer tensors, in each pool's ``buffers()`` order."""
    memory = Memory(models.device, num_slots=(num_steps + 1) * (committed + 1), row_width=128)

    def fresh(layout: object) -> tuple[KVPool, AttentionBackend]:
        pool = make_pool(layout, memory.allocator.size, models.dtype, models.device)  # type: ignore[arg-type]
        return pool, make_backend("torch", pool, memory.req_to_token_pool)

    pool, backend = fresh(models.target.kv_layout)
    target = TargetModelRunner(models.target, pool, memory.req_to_token_pool, backend)
    batch = Requests(memory, 1).extend([tokens[:committed]])
    hidden = target.forward(batch).hidden_states
    target_rows = [buf[batch.out_cache_loc] for buf in pool.buffers()]
    layer_rows: list[list[torch.Tensor]] = []
    for i in range(num_steps):
        pool, backend = fresh(models.drafts[i].kv_layout)
        runner = DraftModelRunner(models.drafts[i], pool, memory.req_to_token_pool, backend)
        batch = Requests(memory, 1).extend([tokens[i + 1 : committed + 1]])
        hidden = runner.forward(batch, hidden[: committed - i]).hidden_states
        layer_rows.append([buf[batch.out_cache_loc] for buf in pool.buffers()])
    return target_rows, layer_rows


def written_slots(pool: KVPool) -> set[int]:
    """Slots whose row no longer holds only the poison in some buffer of ``pool``."""
    first = pool.buffers()[0]
    written = torch.zeros(first.shape[0], dtype=torch.bool, device=first.device)
    for buf in pool.buffers():
        written |= buf.ne(POISON).flatten(1).any(dim=1)
    return set(written.nonzero().flatten().tolist())


def pool_problems(mtp: MTPEngine, models: SpecModels, ends: dict[int, int]) -> list[str]:
    """What is wrong with the pools after a run that started from poisoned pools.

    ``ends[request_id]``: the end of the columns the request's last step wrote (its committed
    length before that step + N). Every pool — the target's and each layer's — must have
    written exactly those columns' slots, and hold at the committed positions what a clean
    recomputation of its own model gives."""
    problems: list[str] = []
    running = mtp.engine.scheduler.running
    expected: set[int] = set()
    for request in running:
        assert request.row is not None
        expected |= set(mtp.table.req_to_token[request.row, : ends[request.request_id]].tolist())
    named = [("target", mtp.target.kv_pool)] + [
        (f"MTP layer {i}", pool) for i, pool in enumerate(mtp.layer_pools)
    ]
    for name, pool in named:
        written = written_slots(pool)
        if written != expected:
            problems.append(
                f"{name}: {len(written - expected)} unexpected and "
                f"{len(expected - written)} missing written slots"
            )
    for request in running:
        assert request.row is not None
        length = request.committed_len
        target_rows, layer_rows = clean_kv(models, len(mtp.layer_pools), request.all_ids, length)
        checks = [("target", mtp.target.kv_pool, target_rows, length)] + [
            (f"MTP layer {i}", pool, rows, length - i)
            for i, (pool, rows) in enumerate(zip(mtp.layer_pools, layer_rows, strict=True))
        ]
        for name, pool, rows, count in checks:
            slots = mtp.table.req_to_token[request.row, :count].long()
            for ours, clean in zip(pool.buffers(), rows, strict=True):
                if not torch.allclose(ours[slots], clean, rtol=1e-4, atol=1e-5):
                    problems.append(f"{name}: request {request.request_id} KV differs")
    return problems


def run_from_poisoned_pools(mtp: MTPEngine, prompts: Sequence[Sequence[int]]) -> dict[int, int]:
    """Poison every pool, run six steps; returns each request's last written column."""
    for pool in [mtp.target.kv_pool, *mtp.layer_pools]:
        for buf in pool.buffers():
            buf.fill_(POISON)
    for prompt in prompts:
        mtp.engine.submit(prompt, SamplingParams(max_new_tokens=3 * MAX_NEW))
    ends: dict[int, int] = {}
    for _ in range(6):
        ends = {
            r.request_id: r.committed_len + mtp.worker.shape.num_draft_tokens
            for r in mtp.engine.scheduler.running
        }
        mtp.engine.step()
    assert len(mtp.engine.scheduler.running) == len(prompts)
    return ends


@pytest.mark.parametrize("arch", ["deepseek-mla", "llama"])
def test_each_mtp_layer_writes_only_its_own_pool_and_its_kv_equals_a_clean_recomputation(
    mtp_models: ModelCache, arch: str, device: torch.device
) -> None:
    """Upstream PR #22954: every draft step used the first runner's token pool."""
    models = mtp_models(arch, device)
    num_steps = NUM_LAYERS[arch]
    prompts = prompts_for([1, 4, 9], seed=5)  # the 1-token prompt starts shorter than S − 1
    mtp = mtp_engine(models, num_steps, prompts=prompts)
    ends = run_from_poisoned_pools(mtp, prompts)
    stats = mtp.engine.stats
    assert pool_problems(mtp, models, ends) == []
    accepted = [n for r in mtp.engine.scheduler.running for n in r.emitted_per_step]
    assert max(accepted) > 1 and min(accepted) <= num_steps  # deep and partial acceptance
    assert stats.num_steps == 6


def test_the_regression_check_catches_layers_that_share_the_first_runners_pool(
    mtp_models: ModelCache,
) -> None:
    models = mtp_models("deepseek-mla")
    prompts = prompts_for([1, 4, 9], seed=5)
    mtp = mtp_engine(models, 3, prompts=prompts, first_runners_pool=True)
    ends = run_from_poisoned_pools(mtp, prompts)
    problems = pool_problems(mtp, models, ends)
    assert any(p.startswith("MTP layer 1: 0 unexpected and") for p in problems)
    assert any(p.startswith("MTP layer 0: request") for p in problems)  # overwritten by 1, 2


# -- idle, retract and abort, arguments -------------------------------------------------------


@pytest.mark.parametrize(
    "arch",
    ["llama", "deepseek-mla"],
)
def test_an_idle_step_runs_verify_and_every_layer_on_an_empty_batch(
    mtp_models: ModelCache, arch: str
) -> None:
    models = mtp_models(arch)
    num_steps = NUM_LAYERS[arch]
    mtp = mtp_engine(models, num_steps)
    planned = [pool.buffers()[0].clone() for pool in mtp.layer_pools]
    output = mtp.worker.step(SchedulePlan([], [], [], []))
    assert output.requests == [] and output.num_forwards == 1 + num_steps
    assert output.tokens.shape == (0, num_steps + 1)
    assert output.num_emitted.shape == (0,) and output.num_committed.shape == (0,)
    for pool, before in zip(mtp.layer_pools, planned, strict=True):
        assert torch.equal(pool.buffers()[0], before)


def test_retract_and_abort_give_the_plain_outputs_and_free_every_slot_and_row(
    mtp_models: ModelCache,
) -> None:
    models = mtp_models("deepseek-mla")
    prompts = prompts_for([4, 6, 2, 8], seed=9)
    expected = greedy_outputs(plain_engine(models), prompts, 14)
    mtp = mtp_engine(models, 3, prompts=prompts, pool_size=72, max_running=4)
    requests = [mtp.engine.submit(p, SamplingParams(max_new_tokens=14)) for p in prompts]
    steps = 0
    while mtp.engine.has_work():
        mtp.engine.step()
        steps += 1
        if steps == 4:
            mtp.engine.abort(requests[1].request_id)
    assert mtp.engine.stats.num_retracted > 0
    for i, (request, reference) in enumerate(zip(requests, expected, strict=True)):
        if i == 1:
            assert request.finish_reason is FinishReason.ABORT
            assert request.output_ids == reference[: len(request.output_ids)]
        else:
            assert request.output_ids == reference
    assert mtp.allocator.available_size() == mtp.allocator.size
    assert mtp.table.available_size() == 4 and mtp.table.req_to_token.eq(0).all()


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_multi_layer_step_on_cuda_never_synchronises_with_the_host(
    mtp_models: ModelCache, backend: str
) -> None:
    models = mtp_models("deepseek-mla", "cuda")
    mtp = mtp_engine(models, 3, backend=backend)
    prompts = prompts_for([3, 7, 1, 5], seed=60)
    for i, prompt in enumerate(prompts[:3]):
        mtp.engine.submit(prompt, SamplingParams(8, temperature=float(i % 2), top_p=0.9, seed=i))
    mtp.engine.step()  # prefill
    mtp.engine.step()  # a first chain step
    mtp.engine.submit(prompts[3], SamplingParams(8, temperature=1.0, seed=9))
    plan = mtp.engine.scheduler.schedule()  # one prefill and three chain steps in one step
    assert len(plan.prefill) == 1 and len(plan.decode) == 3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        output = mtp.worker.step(plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert output.tokens.shape == (4, 4)
    assert bool((output.num_emitted >= 1).all())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_steps": 2, "topk": 2, "num_draft_tokens": 3}, "topk must be 1"),
        ({"num_steps": 2, "num_draft_tokens": 5}, "num_draft_tokens num_steps \\+ 1"),
        ({"num_steps": 4, "num_draft_tokens": 5}, "needs 1..3 MTP layer runners"),
        ({"num_steps": 2, "num_draft_tokens": 3, "use_aux_hidden": True}, "final hidden"),
    ],
)
def test_settings_a_chain_of_mtp_layers_cannot_run_are_refused(
    mtp_models: ModelCache, options: dict[str, object], message: str
) -> None:
    models = mtp_models("deepseek-mla")
    mtp = mtp_engine(models, 3)
    drafts = mtp.drafts
    with pytest.raises(ValueError, match=message):
        MultiLayerEagleWorkerV2(
            mtp.target,
            drafts,
            draft_hidden_size=mtp.target.hidden_size,
            **options,  # type: ignore[arg-type]
        )


def test_settings_with_mtp_on_a_target_with_two_mtp_layers_run_the_multi_layer_worker(
    tmp_path: Path, device: torch.device
) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
    from eagletree.config.settings import EngineSettings

    sizes = sizes_with(SIZES, num_mtp_layers=2)
    target_dir, draft_dir = write_random_checkpoint(
        tmp_path, "deepseek-mla", "mtp", sizes=sizes, dtype=torch.float32, std=0.15
    )
    config = json.loads((target_dir / "config.json").read_text())
    config["num_nextn_predict_layers"] = 2  # the layers themselves come from draft_dir
    (target_dir / "config.json").write_text(json.dumps(config))
    model = {"target_path": str(target_dir), "dtype": "float32", "device": str(device)}
    common = {
        "backend": {"attention": "torch", "kv_move": "torch"},
        "memory": {"max_total_tokens": 1024, "max_running_requests": 4},
    }
    prompts = prompts_for([3, 6, 1], seed=70)
    plain = build_engine(EngineSettings(**common, model={**model, "max_context_len": 64}))
    expected = greedy_outputs(plain, prompts, 10)
    settings = EngineSettings(
        **common,
        model={**model, "draft_path": str(draft_dir), "max_context_len": 64},
        speculative={"algorithm": "mtp", "num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3},
    )
    engine = build_engine(settings)
    assert greedy_outputs(engine, prompts, 10) == expected
    assert engine.stats.acceptance is not None


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
