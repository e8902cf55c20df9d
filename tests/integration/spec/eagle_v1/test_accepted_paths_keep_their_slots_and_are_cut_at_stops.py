"""EagleWorkerV1 bookkeeping: rejected slots are freed every step, with the rows
pointed at the accepted slots (page 1) or the path's KV moved (page 4), and stop ids,
EOS and max_new_tokens cut an accepted path."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.worker import StepOutput
from eagletree.domain.request import FinishReason
from eagletree.domain.sampling import SamplingParams
from tests.integration.models.harness import Memory, Requests, make_backend
from tests.integration.spec.eagle_v1.engines import (
    ModelCache,
    V1Engine,
    make_pool,
    oracle_v1_engine,
    prompts_for,
)
from tests.integration.spec.harness import SpecModels


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
