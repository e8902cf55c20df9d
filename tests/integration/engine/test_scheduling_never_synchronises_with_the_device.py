"""On CUDA: scheduling, batch building and sampling run without a host
synchronisation."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.app.workers.decode_inputs import DecodeInputBuffers
from eagletree.app.workers.forward_batches import BatchBuilder
from eagletree.app.workers.sampler import sample_next_tokens
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS
from eagletree.domain.sampling import SamplingParams
from tests.conftest import requires_cuda
from tests.fakes import fake_engine_parts, plain_engine
from tests.integration.engine.fake_engines import PROMPTS, _params


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
