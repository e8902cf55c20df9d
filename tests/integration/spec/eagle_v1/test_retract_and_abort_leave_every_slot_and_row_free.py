"""EagleWorkerV1 leaks nothing: retraction under a tight pool, and random workloads
with retract and abort, end with every slot and row free."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagletree.domain.request import FinishReason
from eagletree.domain.sampling import SamplingParams
from tests.integration.spec.eagle_v1.engines import (
    CONFIGS,
    ModelCache,
    V1Engine,
    prompts_for,
    v1_engine,
)
from tests.integration.spec.harness import SIZES, greedy_outputs, plain_engine, ragged_prompts


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
