"""EagleWorkerV1 idle steps and refusals (a dropped request, a draft with a
req_to_token pool of its own), and the scheduler's per-step free of a window's tail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.runner import DraftModelRunner
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.row_slots import free_window_tail
from eagletree.app.workers.eagle_v1 import EagleWorkerV1
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams
from tests.integration.models.harness import make_backend
from tests.integration.spec.eagle_v1.engines import ModelCache, make_pool, prompts_for, v1_engine


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
