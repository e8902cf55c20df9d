"""Engine bookkeeping on the fake runner: retraction under a small pool and an abort
from a progress callback free every slot; progress reports and results carry
timings from the engine's clock."""

from __future__ import annotations

import pytest
import torch

from eagletree.app.engine.loop import Engine
from eagletree.app.engine.reports import GenerationResult, StepReport
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.domain.request import FinishReason
from tests.fakes import fake_engine_parts
from tests.integration.engine.fake_engines import PROMPTS, fake_engine, slots_in_use


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
