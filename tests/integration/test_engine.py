"""Engine end to end: greedy parity (fake runner; Llama vs transformers), stop conditions,
seeded sampling, retract and abort without leaks, and input validation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.app.composition.container import build_engine
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.reports import GenerationResult, StepReport
from eagletree.app.engine.worker import StepOutput
from eagletree.app.workers.decode_inputs import DecodeInputBuffers
from eagletree.app.workers.forward_batches import BatchBuilder
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.app.workers.sampler import sample_next_tokens
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS
from eagletree.domain.batch import ForwardMode
from eagletree.domain.request import FinishReason, Request
from eagletree.domain.sampling import SamplingParams
from tests.conftest import requires_cuda
from tests.fakes import FakeRunner, fake_engine_parts, plain_engine

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11], [12]]


def fake_engine(
    pool_size: int = 512,
    max_running: int = 8,
    context: int = 48,
    eos_token_ids: tuple[int, ...] = (),
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[Engine, FakeRunner]:
    runner, allocator = fake_engine_parts(
        pool_size=pool_size, row_width=context + 4, seed=seed, device=device
    )
    engine = plain_engine(
        runner,
        allocator,
        max_context_len=context,
        max_running_requests=max_running,
        eos_token_ids=eos_token_ids,
    )
    return engine, runner


def slots_in_use(engine: Engine) -> int:
    allocator = engine.scheduler.allocator
    return allocator.size - allocator.available_size()


@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_greedy_output_equals_the_reference_decode_for_ragged_batches(
    batch_size: int, device: torch.device
) -> None:
    engine, runner = fake_engine(device=device)
    prompts = PROMPTS[:batch_size]
    results = engine.generate(prompts, max_new_tokens=10)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == runner.greedy_reference(prompt, 10)
        assert result.finish_reason is FinishReason.LENGTH
        assert result.prompt_ids == tuple(prompt)
    assert slots_in_use(engine) == 0
    assert engine.stats.num_generated_tokens == 10 * batch_size


def test_requests_arriving_later_prefill_while_earlier_ones_decode() -> None:
    engine, runner = fake_engine()
    first = engine.submit(PROMPTS[0], _params(6))
    engine.step()
    engine.step()
    second = engine.submit(PROMPTS[1], _params(6))
    engine.step()
    assert [r.mode for r in runner.records[-2:]] == [ForwardMode.EXTEND, ForwardMode.DECODE]
    while engine.has_work():
        engine.step()
    assert first.output_ids == runner.greedy_reference(PROMPTS[0], 6)
    assert second.output_ids == runner.greedy_reference(PROMPTS[1], 6)


def test_eos_and_stop_token_ids_end_a_request_and_are_kept() -> None:
    probe, _ = fake_engine()
    reference = probe.generate([PROMPTS[2]], max_new_tokens=12)[0].output_ids
    eos = reference[4]
    first_eos = reference.index(eos)
    engine, _ = fake_engine(eos_token_ids=(eos,))
    [result] = engine.generate([PROMPTS[2]], max_new_tokens=12)
    assert result.output_ids == reference[: first_eos + 1]
    assert result.finish_reason is FinishReason.EOS
    [result] = probe.generate([PROMPTS[2]], max_new_tokens=12, stop_token_ids=[eos])
    assert result.output_ids == reference[: first_eos + 1]
    assert result.finish_reason is FinishReason.STOP


def test_a_request_stops_at_the_context_length() -> None:
    engine, runner = fake_engine(context=10)
    [result] = engine.generate([PROMPTS[2]], max_new_tokens=50)
    assert len(result.prompt_ids) + len(result.output_ids) == 10
    assert result.output_ids == runner.greedy_reference(PROMPTS[2], 4)
    assert result.finish_reason is FinishReason.LENGTH


def test_seeded_sampling_does_not_depend_on_the_other_requests_of_the_batch() -> None:
    engine, _ = fake_engine()
    together = engine.generate(PROMPTS, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    # request 2 of the call samples with seed 7 + 2, whatever shares its batches
    alone = fake_engine()[0].generate([PROMPTS[2]], 12, temperature=1.0, top_p=0.9, seed=9)
    assert alone[0].output_ids == together[2].output_ids
    again = fake_engine()[0].generate(PROMPTS, 12, temperature=1.0, top_p=0.9, seed=7)
    assert [r.output_ids for r in again] == [r.output_ids for r in together]
    other = fake_engine()[0].generate(PROMPTS, 12, temperature=1.0, top_p=0.9, seed=8)
    assert [r.output_ids for r in other] != [r.output_ids for r in together]


def test_sampling_with_top_k_1_or_a_tiny_top_p_is_greedy() -> None:
    engine, runner = fake_engine()
    for results in (
        engine.generate(PROMPTS, 8, temperature=2.0, top_k=1, seed=1),
        engine.generate(PROMPTS, 8, temperature=2.0, top_p=1e-6, seed=1),
    ):
        assert [r.output_ids for r in results] == [runner.greedy_reference(p, 8) for p in PROMPTS]


def test_sampled_tokens_stay_inside_the_top_k_of_the_reference_distribution() -> None:
    engine, runner = fake_engine()
    [result] = engine.generate([PROMPTS[0]], 16, temperature=1.5, top_k=3, seed=3)
    tokens = list(PROMPTS[0])
    for token in result.output_ids:
        allowed = torch.topk(runner.reference_logits(tokens), 3).indices.tolist()
        assert token in allowed
        tokens.append(token)
    assert len(set(result.output_ids)) > 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_retract_with_a_pool_too_small_gives_the_unconstrained_outputs_and_frees_every_slot(
    temperature: float, device: torch.device
) -> None:
    prompts = [[i + 1, i + 2, i + 3, i + 4] for i in range(4)]
    roomy, _ = fake_engine(device=device)
    expected = roomy.generate(prompts, max_new_tokens=14, temperature=temperature, seed=5)
    # 4 requests of up to 18 tokens need 72 slots at the end; the pool has 40
    tight, _ = fake_engine(pool_size=40, device=device)
    free_at_start = tight.scheduler.allocator.available_size()
    results = tight.generate(prompts, max_new_tokens=14, temperature=temperature, seed=5)
    assert [r.output_ids for r in results] == [r.output_ids for r in expected]
    assert tight.stats.num_retracted > 0
    assert sum(r.num_retractions for r in results) == tight.stats.num_retracted
    assert tight.scheduler.allocator.available_size() == free_at_start
    assert tight.scheduler.req_to_token_pool.available_size() == 8


def test_abort_from_a_progress_callback_ends_the_request_and_frees_its_slots() -> None:
    engine, runner = fake_engine()
    reports: list[StepReport] = []

    def on_step(report: StepReport) -> None:
        reports.append(report)
        if report.step == 3:
            assert engine.abort(1)

    results = engine.generate(PROMPTS[:3], max_new_tokens=10, on_step=on_step)
    assert results[1].finish_reason is FinishReason.ABORT
    assert results[1].output_ids == runner.greedy_reference(PROMPTS[1], 3)
    assert [r.finish_reason for r in (results[0], results[2])] == [FinishReason.LENGTH] * 2
    assert engine.stats.num_aborted == 1
    assert slots_in_use(engine) == 0
    assert reports[-1].num_finished == 3
    assert [r.step for r in reports] == list(range(1, len(reports) + 1))


def test_progress_reports_time_the_call_with_the_engines_clock() -> None:
    runner, allocator = fake_engine_parts(row_width=52)
    ticks: list[float] = []

    def clock() -> float:  # one tick per reading, so each report's elapsed is a whole count
        ticks.append(float(len(ticks)))
        return ticks[-1]

    engine = Engine(
        NonSpeculativeWorker(runner),
        allocator,
        runner.req_to_token_pool,
        vocab_size=runner.vocab_size,
        max_context_len=48,
        max_running_requests=8,
        clock=clock,
    )
    reports: list[StepReport] = []
    engine.generate(PROMPTS[:2], max_new_tokens=4, on_step=reports.append)
    elapsed = [report.elapsed_s for report in reports]
    assert len(elapsed) >= 4 and all(value.is_integer() for value in elapsed)
    assert elapsed[0] > 0 and elapsed == sorted(set(elapsed))  # strictly increasing
    assert elapsed[-1] < ticks[-1]  # measured from a reading taken after the submits


def test_results_carry_timings_in_order() -> None:
    engine, _ = fake_engine()
    [result] = engine.generate([PROMPTS[0]], max_new_tokens=5)
    timings = result.timings
    assert 0 <= timings.queue_s <= timings.time_to_first_token_s <= timings.latency_s
    assert isinstance(result, GenerationResult) and result.acceptance is None
    assert engine.stats.generated_tokens_per_s > 0


@pytest.mark.parametrize(
    ("prompts", "max_new_tokens", "message"),
    [
        ([[1, 2], []], 4, r"request 1: the prompt is empty"),
        ([[1] * 48], 4, r"request 0: the prompt has 48 tokens but the context holds 48"),
        ([[1, 2]], 0, r"max_new_tokens must be >= 1, got 0"),
        ([[1, 2], [3, 32]], 4, r"request 1: token id 32 at position 1 is outside the vocab"),
        ([[1, -1]], 4, r"request 0: token id -1 at position 1 is outside the vocabulary"),
        ([[1, 2], [3, 4]], 200, r"request 0: needs up to 48 KV slots .* pool has 40"),
    ],
)
def test_bad_input_raises_value_error_naming_the_request_and_queues_nothing(
    prompts: list[list[int]], max_new_tokens: int, message: str
) -> None:
    engine, _ = fake_engine(pool_size=40)
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, max_new_tokens=max_new_tokens)
    assert not engine.has_work()


def _params(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens)


class OracleChainWorker:
    """A stand-in for a speculative worker: each decode step emits 1..max_emit greedy tokens
    of the fake model (known on the host), committing as many, inside a 2·max_emit window."""

    def __init__(self, runner: FakeRunner, max_emit: int, seed: int) -> None:
        self._runner = runner
        self._max_emit = max_emit
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def reserve_per_step(self) -> int:
        return 2 * self._max_emit

    def can_run_ahead(self, decode: Sequence[Request]) -> bool:
        return False  # it reads the requests' tokens on the host

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float:
        return 0.0  # it has no device step to capture

    def calibrate(self, progress: Callable[[str], None] | None = None) -> None:
        return None  # it chooses nothing per step

    def step(self, plan: SchedulePlan) -> StepOutput:
        rows, emitted, committed = [], [], []
        for request in plan.prefill + plan.decode:
            count = 1
            if request in plan.decode:
                count = int(torch.randint(1, self._max_emit + 1, (1,), generator=self._generator))
                assert request.allocated_len >= request.committed_len + self.reserve_per_step
            tokens = self._runner.greedy_reference(request.all_ids, count)
            rows.append(tokens + [0] * (self._max_emit - count))
            emitted.append(count)
            committed.append(request.num_tokens - request.committed_len + count - 1)
        return StepOutput(
            requests=plan.prefill + plan.decode,
            tokens=torch.tensor(rows),
            num_emitted=torch.tensor(emitted),
            num_committed=torch.tensor(committed),
            num_forwards=1,
            num_prefill=len(plan.prefill),
            speculative=True,
        )


def test_multi_token_steps_are_cut_at_eos_and_max_new_tokens_and_counted_as_acceptance() -> None:
    probe, _ = fake_engine()
    expected = probe.generate(PROMPTS, max_new_tokens=11)
    eos = expected[0].output_ids[6]
    runner_for_chain, allocator = fake_engine_parts(pool_size=256, row_width=64)
    engine = Engine(
        OracleChainWorker(runner_for_chain, max_emit=4, seed=1),
        allocator,
        runner_for_chain.req_to_token_pool,
        vocab_size=32,
        max_context_len=48,
        max_running_requests=4,
        eos_token_ids=(eos,),
    )
    results = engine.generate(PROMPTS, max_new_tokens=11)
    for result, reference in zip(results, expected, strict=True):
        ids = reference.output_ids
        cut = ids.index(eos) + 1 if eos in ids else len(ids)
        assert result.output_ids == ids[:cut]
        if len(result.output_ids) == 1:  # finished by its prefill: no verify step
            assert result.acceptance is None
            continue
        acceptance = result.acceptance
        assert acceptance is not None
        assert all(1 <= n <= 4 for n, steps in enumerate(acceptance.histogram) if steps)
        # every step's tokens were emitted; only the last step may overshoot the cut
        overshoot = acceptance.num_emitted - (len(result.output_ids) - 1)
        assert 0 <= overshoot < 4
    assert engine.stats.acceptance is not None and engine.stats.acceptance.mean_accept_length > 1
    assert allocator.available_size() == 256


# -- a Llama target against transformers ------------------------------------------------------

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "gqa-untied": {"num_attention_heads": 4, "num_key_value_heads": 2, "tie": False},
    "mha-tied": {"num_attention_heads": 4, "num_key_value_heads": 4, "tie": True},
}


@pytest.fixture(scope="module", params=list(HF_CONFIGS))
def hf_checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path]:
    """A random tiny HF Llama (fp32) saved with save_pretrained, and the HF model itself."""
    transformers = pytest.importorskip("transformers")
    shape: dict[str, Any] = HF_CONFIGS[request.param]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_key_value_heads"],
        max_position_embeddings=128,
        tie_word_embeddings=shape["tie"],
        rope_theta=500.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp(f"llama-{request.param}")
    model.save_pretrained(path)
    return model, path


def llama_engine(
    path: Path, pool_size: int = 512, max_running: int = 4, device: torch.device | str = "cpu"
) -> Engine:
    from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
    from eagletree.adapters.memory.mha_pool import MHAKVPool
    from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
    from eagletree.adapters.memory.row_movers import TorchRowMover
    from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
    from eagletree.adapters.models.loading import load_target
    from eagletree.adapters.models.runner import TargetModelRunner
    from eagletree.adapters.models.stack import MHALayout

    model = load_target(path, torch.float32, device)
    layout = model.kv_layout
    assert isinstance(layout, MHALayout)
    kv_pool = MHAKVPool(
        size=pool_size,
        layer_num=layout.layer_num,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        v_head_dim=layout.v_head_dim,
        dtype=torch.float32,
        device=device,
        mover=TorchRowMover(),
    )
    table = TensorReqToTokenPool(max_running, 128 + 8, device)
    runner = TargetModelRunner(model, kv_pool, table, TorchAttentionBackend(kv_pool, table))
    return plain_engine(
        runner,
        DeviceSlotAllocator(pool_size, device),
        max_context_len=128,
        max_running_requests=max_running,
    )


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    output = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
    )
    tokens: list[int] = output[0, len(prompt) :].tolist()
    return tokens


def ragged_prompts(batch_size: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = [1, 9, 4, 15][:batch_size]
    return [torch.randint(0, 96, (n,), generator=generator).tolist() for n in lengths]


@pytest.mark.hf
@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_engine_greedy_output_equals_transformers_generate(
    hf_checkpoint: tuple[Any, Path], batch_size: int, device: torch.device
) -> None:
    hf_model, path = hf_checkpoint
    prompts = ragged_prompts(batch_size, seed=batch_size)
    results = llama_engine(path, device=device).generate(prompts, max_new_tokens=10)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf_model, prompt, 10)


@pytest.mark.hf
def test_llama_retract_under_a_tight_pool_keeps_the_transformers_output(
    hf_checkpoint: tuple[Any, Path],
) -> None:
    hf_model, path = hf_checkpoint
    prompts = ragged_prompts(4, seed=11)
    engine = llama_engine(path, pool_size=48)  # 4 requests grow to 1+9+4+15 + 4·10 = 69 tokens
    results = engine.generate(prompts, max_new_tokens=10)
    assert engine.stats.num_retracted > 0
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf_model, prompt, 10)
    assert engine.scheduler.allocator.available_size() == 48


@pytest.mark.hf
def test_build_engine_wires_the_checkpoint_through_the_container(
    hf_checkpoint: tuple[Any, Path], device: torch.device
) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.config.settings import EngineSettings

    hf_model, path = hf_checkpoint
    settings = EngineSettings(
        model={"target_path": str(path), "device": str(device), "dtype": "float32"},
        backend={"attention": "torch", "kv_move": "torch"},
        memory={"max_total_tokens": 256, "max_running_requests": 2},
    )
    engine = build_engine(settings)
    assert engine.max_context_len == 128  # the checkpoint's max_position_embeddings
    assert engine.eos_token_ids == frozenset()
    prompts = ragged_prompts(3, seed=5)
    results = engine.generate(prompts, max_new_tokens=6)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf_model, prompt, 6)


@requires_cuda
@pytest.mark.gpu
def test_scheduling_batch_building_and_sampling_do_not_synchronise_with_the_device() -> None:
    runner, _ = fake_engine_parts(device="cuda")
    allocator = DeviceSlotAllocator(512, "cuda")  # debug checks off: frees stay on the device
    engine = plain_engine(runner, allocator, max_context_len=48, max_running_requests=8)
    for prompt in PROMPTS[:2]:
        engine.submit(prompt, SamplingParams(max_new_tokens=3, temperature=1.0, top_k=5, seed=1))
    engine.step()
    for prompt in PROMPTS[2:]:
        engine.submit(prompt, _params(6))
    batches = BatchBuilder(runner.req_to_token_pool)
    decode_inputs = DecodeInputBuffers.for_pool(runner.req_to_token_pool, padded=False)
    logits = torch.randn(4, 32, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plan = engine.scheduler.schedule()  # windows grow for two, two are admitted
        batches.extend(plan.prefill)
        decode_inputs.fill(plan.decode, len(plan.decode), num_coins=1)  # the decode step's input
        sample_next_tokens(logits, plan.prefill + plan.decode, REFERENCE_KERNELS)
        for request in plan.decode:
            request.mark_aborted()
        engine.scheduler.release_finished()  # frees rows and slots
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(plan.prefill) == 2 and len(plan.decode) == 2


@pytest.mark.parametrize("tp", [1, 2])
def test_build_engine_sends_data_parallelism_to_the_data_parallel_builder(tp: int) -> None:
    pytest.importorskip("pydantic_settings")
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.errors import ConfigurationError

    settings = EngineSettings(
        model={"target_path": "/nonexistent", "device": "cpu", "dtype": "float32"},
        parallel={"dp_size": 2, "tp_size": tp},
    )
    with pytest.raises(
        ConfigurationError, match=r"parallel\.dp_size = 2: .*build_data_parallel_engine"
    ):
        build_engine(settings)


def test_build_engine_with_tensor_parallelism_outside_a_process_group_says_how_to_launch(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pydantic_settings")
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.errors import ConfigurationError

    settings = EngineSettings(
        model={"target_path": str(tmp_path), "device": "cpu", "dtype": "float32"},
        parallel={"tp_size": 2},
    )
    with pytest.raises(
        ConfigurationError, match=r"parallel\.tp_size = 2 × parallel\.dp_size = 1 needs 2 proc"
    ):
        build_engine(settings)
