"""MultiLayerEagleWorkerV2 steps: an idle step runs verify and every layer on an
empty batch, retract and abort leave no slot or row behind, and (on CUDA) a step
never synchronises with the host."""

from __future__ import annotations

import pytest
import torch

from eagletree.app.engine.plan import SchedulePlan
from eagletree.domain.request import FinishReason
from eagletree.domain.sampling import SamplingParams
from tests.conftest import requires_cuda
from tests.integration.spec.harness import greedy_outputs, plain_engine
from tests.integration.spec.multi_layer_mtp.engines import (
    NUM_LAYERS,
    ModelCache,
    mtp_engine,
    prompts_for,
)


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
