"""EagleWorkerV1 end to end: v1 == v2 == plain greedy, rejected slots freed every step with the
rows pointed at the accepted slots (page 1) or the path's KV moved (page 4), stop conditions,
no leaks under retract and abort, idle steps; and the scheduler's per-step free."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.adapters.models.stack import KVLayout, MHALayout
from eagletree.app.composition.container import build_engine
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.scheduler import PrefillStep, free_window_tail
from eagletree.app.engine.worker import StepOutput
from eagletree.app.workers.eagle_v1 import EagleWorkerV1
from eagletree.domain.request import FinishReason, Request
from eagletree.domain.sampling import SamplingParams
from eagletree.ports.memory import KVPool
from eagletree.ports.model import DraftRunner
from tests.conftest import requires_triton
from tests.integration.models.harness import Memory, Requests, make_backend
from tests.integration.spec.harness import (
    CONTEXT_LEN,
    SIZES,
    SpecModels,
    greedy_outputs,
    load_spec_models,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)
from tests.integration.spec.oracle_draft import OracleDraft

CONFIGS = [(1, 1, 2), (3, 1, 4), (5, 4, 8), (4, 8, 32)]  # (S, k, N)
PROMPT_LENGTHS = [3, 7, 1, 12, 5, 9]
MAX_NEW = 16

ModelCache = Callable[..., SpecModels]


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread() -> Iterator[None]:
    """Tiny matrices: one thread is ~50x faster than two on a shared two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def spec_models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    cache: dict[tuple[object, ...], SpecModels] = {}

    def get(arch: str, kind: str, device: torch.device) -> SpecModels:
        key = (arch, kind, str(device))
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{kind}")
            cache[key] = load_spec_models(root, arch, kind, device)  # type: ignore[arg-type]
        return cache[key]

    return get


def prompts_for(batch_size: int, seed: int) -> list[list[int]]:
    lengths = [PROMPT_LENGTHS[(seed + i) % len(PROMPT_LENGTHS)] for i in range(batch_size)]
    return ragged_prompts(SIZES.vocab_size, lengths, seed)


# -- engines ----------------------------------------------------------------------------------


def make_pool(layout: KVLayout, size: int, models: SpecModels, page_size: int) -> KVPool:
    if isinstance(layout, MHALayout):
        return MHAKVPool(
            size,
            layout.layer_num,
            layout.kv_heads,
            layout.head_dim,
            layout.v_head_dim,
            models.dtype,
            models.device,
            TorchRowMover(),
            page_size=page_size,
        )
    return MLAKVPool(
        size,
        layout.layer_num,
        layout.kv_lora_rank,
        layout.qk_rope_head_dim,
        models.dtype,
        models.device,
        TorchRowMover(),
        page_size=page_size,
    )


@dataclass(frozen=True, slots=True)
class V1Engine:
    engine: Engine
    worker: EagleWorkerV1
    target: TargetModelRunner
    allocator: DeviceSlotAllocator
    table: TensorReqToTokenPool


def v1_engine(
    models: SpecModels,
    config: tuple[int, int, int],
    *,
    page_size: int = 1,
    pool_size: int = 4096,
    max_running: int = 8,
    eos_token_ids: Sequence[int] = (),
    wrap_draft: Callable[[DraftModelRunner], DraftRunner] | None = None,
    backend: str = "torch",
    prefill_step: PrefillStep = "with_decode",
) -> V1Engine:
    num_steps, topk, n = config
    allocator = DeviceSlotAllocator(pool_size, models.device, debug_checks=True)
    reserve = max(num_steps * topk, n)
    table = TensorReqToTokenPool(max_running, CONTEXT_LEN + reserve + 4, models.device)
    target_pool = make_pool(models.target.kv_layout, pool_size, models, page_size)
    target = TargetModelRunner(
        models.target, target_pool, table, make_backend(backend, target_pool, table)
    )
    head = models.drafts[0]
    draft_pool = make_pool(head.kv_layout, pool_size, models, page_size)
    real_draft = DraftModelRunner(
        head,
        draft_pool,
        table,
        make_backend(backend, draft_pool, table),
    )
    draft: DraftRunner = real_draft if wrap_draft is None else wrap_draft(real_draft)
    worker = EagleWorkerV1(
        target,
        draft,
        allocator=allocator,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=n,
        draft_hidden_size=real_draft.hidden_size,
        use_aux_hidden=models.kind == "eagle3",
    )
    engine = Engine(
        worker,
        allocator,
        table,
        vocab_size=target.vocab_size,
        max_context_len=CONTEXT_LEN,
        max_running_requests=max_running,
        eos_token_ids=eos_token_ids,
        prefill_step=prefill_step,
    )
    return V1Engine(engine, worker, target, allocator, table)


def oracle_wrapper(
    models: SpecModels,
    prompts: Sequence[Sequence[int]],
    topk: int,
    max_new: int,
    engine_of: Callable[[], Engine],
    seed: int,
) -> tuple[Callable[[DraftModelRunner], DraftRunner], list[list[int]]]:
    """A ``wrap_draft`` that turns the draft into the oracle of ``prompts``' greedy
    continuations (``max_new`` tokens, also returned), for the engine ``engine_of()``."""
    continuation = greedy_outputs(plain_engine(models), prompts, max_new + 10)
    sequences = {tuple(p): [*p, *out] for p, out in zip(prompts, continuation, strict=True)}

    def sequence_of_row(row: int) -> list[int]:
        [owner] = [r for r in engine_of().scheduler.running if r.row == row]
        return sequences[owner.prompt_ids]

    def wrap(draft: DraftModelRunner) -> DraftRunner:
        return OracleDraft(draft, sequence_of_row, topk, seed=seed)

    return wrap, [out[:max_new] for out in continuation]


def oracle_v1_engine(
    models: SpecModels,
    config: tuple[int, int, int],
    prompts: Sequence[Sequence[int]],
    max_new: int,
    **options: object,
) -> tuple[V1Engine, list[list[int]]]:
    holder: list[V1Engine] = []
    wrap, expected = oracle_wrapper(
        models, prompts, config[1], max_new, lambda: holder[0].engine, seed=sum(config)
    )
    holder.append(v1_engine(models, config, wrap_draft=wrap, **options))  # type: ignore[arg-type]
    return holder[0], expected


def oracle_v2_engine(
    models: SpecModels, config: tuple[int, int, int], prompts: Sequence[Sequence[int]]
) -> Engine:
    holder: list[Engine] = []
    wrap, _ = oracle_wrapper(
        models, prompts, config[1], MAX_NEW, lambda: holder[0], seed=sum(config)
    )
    holder.append(speculative_engine(models, *config, wrap_draft=wrap).engine)
    return holder[0]


def committed_target_kv_matches_a_fresh_prefill(v1: V1Engine, models: SpecModels) -> None:
    """The target KV at every running request's committed positions (through its row) equals
    a plain prefill of its committed tokens: the rewritten rows / moved KV are right."""
    for request in v1.engine.scheduler.running:
        assert request.row is not None
        length = request.committed_len
        memory = Memory(models.device, num_slots=length + 4)
        fresh_pool = make_pool(models.target.kv_layout, memory.allocator.size, models, 1)
        fresh = TargetModelRunner(
            models.target,
            fresh_pool,
            memory.req_to_token_pool,
            make_backend("torch", fresh_pool, memory.req_to_token_pool),
        )
        batch = Requests(memory, 1).extend([request.all_ids[:length]])
        fresh.forward(batch)
        slots = v1.table.req_to_token[request.row, :length].long()
        for ours, theirs in zip(v1.target.kv_pool.buffers(), fresh_pool.buffers(), strict=True):
            torch.testing.assert_close(ours[slots], theirs[batch.out_cache_loc])


# -- greedy losslessness ----------------------------------------------------------------------


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


# -- bookkeeping: page 1 rewrites rows, page 4 moves KV ---------------------------------------


@pytest.mark.parametrize("page_size", [1, 4])
def test_each_step_keeps_only_the_accepted_slots_and_their_kv_is_the_committed_tokens(
    spec_models: ModelCache, page_size: int, monkeypatch: pytest.MonkeyPatch, device: torch.device
) -> None:
    models = spec_models("llama", "eagle", device)
    prompts = prompts_for(3, seed=7)
    v1, expected = oracle_v1_engine(models, (5, 4, 8), prompts, 20, page_size=page_size)
    rewritten_columns = 0
    worker_step = v1.worker.step

    def step_and_check_rows(plan: SchedulePlan) -> StepOutput:
        nonlocal rewritten_columns
        before = [v1.table.req_to_token[r.row].clone() for r in plan.decode]
        output = worker_step(plan)
        for request, old_row in zip(plan.decode, before, strict=True):
            assert request.row is not None
            path_end = request.committed_len + int(
                output.num_committed[len(plan.prefill) :][plan.decode.index(request)]
            )
            end = request.allocated_len
            # page 1 keeps exactly the path's slots; page 4 keeps up to the end of its page
            assert end == -(-path_end // page_size) * page_size
            row = v1.table.req_to_token[request.row]
            assert row[end:].eq(0).all()
            rewritten_columns += int((row[:end] != old_row[:end]).sum())
        return output

    monkeypatch.setattr(v1.worker, "step", step_and_check_rows)
    requests = [v1.engine.submit(p, SamplingParams(max_new_tokens=20)) for p in prompts]
    while v1.engine.has_work():
        v1.engine.step()
        in_use = v1.allocator.size - v1.allocator.available_size()
        assert in_use == sum(r.allocated_len for r in v1.engine.scheduler.running)
        committed_target_kv_matches_a_fresh_prefill(v1, models)
    assert [r.output_ids for r in requests] == expected
    if page_size == 1:
        assert rewritten_columns > 0  # side-branch paths were pointed at
    else:
        assert rewritten_columns == 0  # rows are never rewritten: pages stay dense
    assert v1.allocator.available_size() == v1.allocator.size


def test_stop_ids_eos_and_max_new_tokens_cut_an_accepted_path(spec_models: ModelCache) -> None:
    models = spec_models("llama", "eagle", torch.device("cpu"))
    prompts = prompts_for(2, seed=30)
    _, reference = oracle_v1_engine(models, (3, 1, 4), prompts, 12)
    for prompt, ref in zip(prompts, reference, strict=True):
        cut = next(j for j in (2, 3, 6, 7) if ref[j] not in ref[:j])
        v1, _ = oracle_v1_engine(models, (3, 1, 4), [prompt], 12, eos_token_ids=(ref[cut],))
        [result] = v1.engine.generate([prompt], 12)
        assert result.output_ids == ref[: cut + 1]
        assert result.finish_reason is FinishReason.EOS
        assert v1.allocator.available_size() == v1.allocator.size
    v1, _ = oracle_v1_engine(models, (3, 1, 4), prompts, 12, page_size=4)
    results = v1.engine.generate(prompts, max_new_tokens=7)
    assert [r.output_ids for r in results] == [ref[:7] for ref in reference]
    assert v1.allocator.available_size() == v1.allocator.size


# -- no leaks ---------------------------------------------------------------------------------


def assert_everything_free(v1: V1Engine, max_running: int) -> None:
    assert v1.allocator.available_size() == v1.allocator.size
    assert v1.table.available_size() == max_running
    assert v1.table.req_to_token.eq(0).all()


def test_retract_with_a_tight_pool_gives_the_plain_outputs_and_frees_every_slot(
    spec_models: ModelCache,
) -> None:
    models = spec_models("llama", "eagle", torch.device("cpu"))
    prompts = prompts_for(4, seed=11)
    expected = greedy_outputs(plain_engine(models), prompts, 14)
    v1 = v1_engine(models, (3, 2, 6), pool_size=64)
    assert greedy_outputs(v1.engine, prompts, 14) == expected
    assert v1.engine.stats.num_retracted > 0
    assert_everything_free(v1, 8)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**16),
    config=st.sampled_from(CONFIGS),
    page_size=st.sampled_from([1, 4]),
    num_requests=st.integers(1, 5),
    abort_at=st.integers(1, 8),
    slack=st.integers(0, 12),
)
def test_random_workloads_with_retract_and_abort_leave_every_slot_and_row_free(
    spec_models: ModelCache,
    seed: int,
    config: tuple[int, int, int],
    page_size: int,
    num_requests: int,
    abort_at: int,
    slack: int,
) -> None:
    models = spec_models("llama", "eagle", torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (num_requests,), generator=generator).tolist()
    prompts = ragged_prompts(SIZES.vocab_size, lengths, seed)
    max_new = 10
    reserve = max(config[0] * config[1], config[2])
    # the longest request alone just fits, plus some slack: several together must retract
    pool_size = max(lengths) + max_new - 1 + reserve + slack
    v1 = v1_engine(models, config, page_size=page_size, pool_size=pool_size, max_running=4)
    free_rows = v1.table.available_size()
    victim = seed % num_requests
    requests = [v1.engine.submit(p, SamplingParams(max_new_tokens=max_new)) for p in prompts]
    steps = 0
    while v1.engine.has_work():
        v1.engine.step()
        steps += 1
        if steps == abort_at:
            v1.engine.abort(requests[victim].request_id)
    expected = greedy_outputs(plain_engine(models), prompts, max_new)
    for i, (request, reference) in enumerate(zip(requests, expected, strict=True)):
        if request.finish_reason is FinishReason.ABORT:
            assert i == victim and request.output_ids == reference[: len(request.output_ids)]
        else:
            assert request.output_ids == reference
    assert_everything_free(v1, free_rows)


# -- idle step, construction, the scheduler's per-step free -----------------------------------


def test_an_idle_step_runs_every_phase_on_an_empty_batch(spec_models: ModelCache) -> None:
    models = spec_models("llama", "eagle3", torch.device("cpu"))
    v1 = v1_engine(models, (3, 4, 8))
    output = v1.worker.step(SchedulePlan([], [], [], []))
    assert output.requests == [] and output.num_prefill == 0
    assert output.tokens.shape == (0, 4) and output.num_emitted.shape == (0,)
    assert output.num_forwards == 2 + 2  # two draft forwards, verify, draft-extend
    assert v1.allocator.available_size() == v1.allocator.size


def test_a_step_refuses_to_verify_a_request_whose_draft_state_it_has_dropped(
    spec_models: ModelCache,
) -> None:
    models = spec_models("llama", "eagle", torch.device("cpu"))
    v1 = v1_engine(models, (3, 2, 4))
    request = v1.engine.submit(prompts_for(1, seed=70)[0], SamplingParams(8))
    v1.engine.step()  # the prefill writes the request's draft state
    assert v1.worker.num_tracked_requests == 1
    v1.worker.step(SchedulePlan([], [], [], []))  # a plan without it: its row is dropped
    assert v1.worker.num_tracked_requests == 0
    with pytest.raises(RuntimeError, match="never prefilled"):
        v1.worker.step(SchedulePlan([], [request], [], []))


def test_a_draft_with_its_own_req_to_token_pool_is_refused(spec_models: ModelCache) -> None:
    models = spec_models("llama", "eagle", torch.device("cpu"))
    v1 = v1_engine(models, (3, 1, 4))
    other = TensorReqToTokenPool(2, 8, "cpu")
    pool = make_pool(models.drafts[0].kv_layout, 16, models, 1)
    draft = DraftModelRunner(
        models.drafts[0],
        pool,
        other,
        make_backend("torch", pool, other),
    )
    with pytest.raises(ValueError, match="share the target runner's req_to_token pool"):
        EagleWorkerV1(
            v1.target,
            draft,
            allocator=v1.allocator,
            num_steps=3,
            topk=1,
            num_draft_tokens=4,
            draft_hidden_size=draft.hidden_size,
        )


def test_free_window_tail_frees_and_clears_exactly_the_tail_and_never_the_committed_prefix(
    tmp_path: Path,
) -> None:
    allocator = DeviceSlotAllocator(32, "cpu", debug_checks=True)
    table = TensorReqToTokenPool(2, 16, "cpu")
    request = Request(0, [5, 6, 7], SamplingParams(max_new_tokens=8), 16)
    request.admit(1, now=0.0)
    slots = allocator.alloc(10)
    assert slots is not None
    table.req_to_token[1, :10] = slots.to(torch.int32)
    request.grow_window(10)
    request.commit(3)
    free_window_tail(request, 6, allocator, table)
    assert request.allocated_len == 6
    assert allocator.available_size() == 32 - 6
    assert table.req_to_token[1, :6].tolist() == slots[:6].tolist()
    assert table.req_to_token[1, 6:].eq(0).all()
    with pytest.raises(AssertionError):
        free_window_tail(request, 2, allocator, table)  # below the committed length
    free_window_tail(request, 3, allocator, table)
    assert allocator.available_size() == 32 - 3


def test_settings_with_page_size_4_and_a_tree_run_v1_end_to_end(
    tmp_path: Path, device: torch.device
) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
    from eagletree.config.settings import EngineSettings

    target_dir, draft_dir = write_random_checkpoint(
        tmp_path, "llama", "eagle", sizes=SIZES, dtype=torch.float32, std=0.15
    )
    model = {
        "target_path": str(target_dir),
        "draft_path": str(draft_dir),
        "dtype": "float32",
        "device": str(device),
        "max_context_len": 64,
    }
    common = {"model": model, "backend": {"attention": "torch", "kv_move": "torch"}}
    memory = {"max_total_tokens": 1024, "max_running_requests": 4}
    prompts = prompts_for(3, seed=70)
    plain = build_engine(EngineSettings(**common, memory=memory))
    expected = greedy_outputs(plain, prompts, 10)
    settings = EngineSettings(
        **common,
        memory={**memory, "page_size": 4},
        speculative={"algorithm": "eagle", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8},
    )
    engine = build_engine(settings)
    assert greedy_outputs(engine, prompts, 10) == expected
    assert engine.stats.acceptance is not None
