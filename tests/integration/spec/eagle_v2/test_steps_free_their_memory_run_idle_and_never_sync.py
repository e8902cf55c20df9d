"""EagleWorkerV2 steps: no slot or row left behind under retract and abort, an idle
step runs every phase on empty tensors, a dropped request is refused, and (on CUDA) a
step never synchronises with the host."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.app.engine.plan import SchedulePlan
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.model_output import ModelOutput
from eagletree.domain.request import FinishReason
from eagletree.domain.sampling import SamplingParams
from eagletree.ports.memory import KVPool
from tests.conftest import requires_cuda
from tests.integration.spec.eagle_v2.engines import MAX_NEW, ModelCache, prompts_for
from tests.integration.spec.harness import greedy_outputs, plain_engine, speculative_engine


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_random_workloads_with_retract_and_abort_leave_no_slot_or_row_behind(
    spec_models: ModelCache, temperature: float, device: torch.device
) -> None:
    models = spec_models("llama", "eagle", device)
    # 100 slots: one request fits (≤ 12 + 16 tokens + 40 reserved), six do not
    spec = speculative_engine(models, 5, 4, 8, pool_size=100, max_running=6)
    allocator, table = spec.memory.allocator, spec.memory.req_to_token_pool
    free_at_start, rows_at_start = allocator.available_size(), table.req_to_token.clone()
    generator = torch.Generator().manual_seed(int(temperature * 10) + 1)
    prompts = prompts_for(12, seed=40)
    expected = greedy_outputs(plain_engine(models), prompts, MAX_NEW)
    submitted = [
        spec.engine.submit(p, SamplingParams(MAX_NEW, temperature=temperature, seed=i))
        for i, p in enumerate(prompts)
    ]
    aborted = set()
    for step in range(1000):
        if not spec.engine.has_work():
            break
        if step % 9 == 8:  # abort a random request, queued, running or already finished
            victim = submitted[int(torch.randint(len(submitted), (1,), generator=generator))]
            if spec.engine.abort(victim.request_id):
                aborted.add(victim.request_id)
        spec.engine.step()
    assert not spec.engine.has_work()
    assert spec.engine.stats.num_retracted > 0 and aborted
    assert allocator.available_size() == free_at_start
    assert torch.equal(table.req_to_token, rows_at_start)
    assert table.available_size() == table.size
    for request in submitted:
        assert request.finish_reason is (
            FinishReason.ABORT if request.request_id in aborted else FinishReason.LENGTH
        )
        if request.request_id not in aborted and temperature == 0.0:
            assert request.output_ids == expected[request.request_id]
    spec.worker.step(SchedulePlan([], [], [], []))  # the next step forgets every finished one
    assert spec.worker.num_tracked_requests == 0


class RecordingPool:
    """A KV pool proxy that records ``move_kv_cache`` calls."""

    def __init__(self, inner: KVPool) -> None:
        self.inner = inner
        self.moves: list[tuple[torch.Tensor, torch.Tensor]] = []

    geometry = property(lambda self: self.inner.geometry)

    def buffers(self) -> list[torch.Tensor]:
        return self.inner.buffers()

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        self.moves.append((tgt_loc, src_loc))
        self.inner.move_kv_cache(tgt_loc, src_loc, independent_groups=independent_groups)


Forward = tuple[str, ForwardMode, int, int]


class RecordingRunner:
    """A target or draft runner proxy that records (name, mode, bs, tokens) of every forward."""

    def __init__(
        self, inner: TargetModelRunner | DraftModelRunner, log: list[Forward], name: str
    ) -> None:
        self._inner = inner
        self._log = log
        self._name = name
        self.kv_pool = RecordingPool(inner.kv_pool)
        self.req_to_token_pool = inner.req_to_token_pool
        self.attention_backend = inner.attention_backend
        self.vocab_size = inner.vocab_size
        self.hidden_size = inner.hidden_size
        self.token_ids = getattr(inner, "token_ids", None)  # a draft's column map

    def forward(self, batch: ForwardBatch, *args: torch.Tensor | None) -> ModelOutput:
        self._log.append((self._name, batch.mode, batch.batch_size, batch.num_tokens))
        return self._inner.forward(batch, *args)  # type: ignore[arg-type]


def test_an_idle_step_runs_draft_verify_compaction_and_draft_extend_on_empty_tensors(
    spec_models: ModelCache, device: torch.device
) -> None:
    models = spec_models("llama", "eagle3", device)
    log: list[Forward] = []
    spec = speculative_engine(
        models,
        4,
        4,
        12,
        wrap_draft=lambda d: RecordingRunner(d, log, "draft"),
        wrap_target=lambda t: RecordingRunner(t, log, "target"),
    )
    spec.engine.generate(prompts_for(2, seed=50), max_new_tokens=4)  # some state exists
    log.clear()
    output = spec.worker.step(SchedulePlan([], [], [], []))
    assert log == [
        *[("draft", ForwardMode.DRAFT_DECODE, 0, 0)] * 3,
        ("target", ForwardMode.TARGET_VERIFY, 0, 0),
        ("draft", ForwardMode.DRAFT_EXTEND, 0, 0),
    ]
    assert isinstance(spec.target.kv_pool, RecordingPool)
    tgt, src = spec.target.kv_pool.moves[-1]
    assert tgt.shape == src.shape == (0,)
    assert output.requests == [] and output.tokens.shape == (0, spec.worker.shape.tokens_per_step)
    assert output.num_emitted.shape == output.num_committed.shape == (0,)
    assert output.num_forwards == 5 and output.speculative


def test_a_step_refuses_to_verify_a_request_whose_draft_state_it_has_dropped(
    spec_models: ModelCache,
) -> None:
    models = spec_models("llama", "eagle", torch.device("cpu"))
    spec = speculative_engine(models, 3, 2, 4)
    request = spec.engine.submit(prompts_for(1, seed=70)[0], SamplingParams(MAX_NEW))
    spec.engine.step()  # the prefill writes the request's draft state
    assert spec.worker.num_tracked_requests == 1
    spec.worker.step(SchedulePlan([], [], [], []))  # a plan without it: its row is dropped
    assert spec.worker.num_tracked_requests == 0
    with pytest.raises(RuntimeError, match="never prefilled"):
        spec.worker.step(SchedulePlan([], [request], [], []))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_v2_step_on_cuda_never_synchronises_with_the_host(
    spec_models: ModelCache, backend: str
) -> None:
    device = torch.device("cuda")
    models = spec_models("llama", "eagle3", device)
    spec = speculative_engine(models, 5, 4, 8, backend=backend)
    engine = spec.engine
    prompts = prompts_for(4, seed=60)
    for i, prompt in enumerate(prompts[:3]):
        engine.submit(prompt, SamplingParams(8, temperature=float(i % 2), top_p=0.9, seed=i))
    engine.step()  # prefill
    engine.step()  # a first tree step
    engine.submit(prompts[3], SamplingParams(8, temperature=1.0, seed=9))
    plan = engine.scheduler.schedule()  # one prefill and three tree steps in one worker step
    assert len(plan.prefill) == 1 and len(plan.decode) == 3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        output = spec.worker.step(plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert output.tokens.shape == (4, spec.worker.shape.tokens_per_step)
    assert bool((output.num_emitted >= 1).all())
