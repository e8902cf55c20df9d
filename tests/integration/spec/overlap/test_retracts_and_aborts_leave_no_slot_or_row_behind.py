"""The overlapped engine under retraction and aborts: 1,000 random requests leave no
slot or row behind, greedy tokens match and seeded samples repeat."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.models.random_checkpoint_config import ModelSizes
from eagletree.domain.request import FinishReason, Request, RequestStatus
from eagletree.domain.sampling import SamplingParams
from tests.integration.spec.harness import plain_engine, speculative_engine
from tests.integration.spec.overlap.runs import MAX_NEW, ModelCache, assert_ran_ahead, prompts_for

TINY = ModelSizes(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    max_position_embeddings=256,
    draft_vocab_size=32,
)


@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_a_thousand_random_requests_with_aborts_and_retracts_leave_no_slot_or_row_behind(
    models: ModelCache, worker: str
) -> None:
    loaded = models("llama", "eagle", TINY)
    if worker == "plain":  # a request needs up to 24 + 16 + 2 = 42 slots; eight do not fit
        engine = plain_engine(loaded, pool_size=60, max_running=8, overlap=True)
    else:  # 90 slots: a request needs up to 24 + 16 + 2·max(S·k, N) = 48; eight do not fit
        engine = speculative_engine(
            loaded, 2, 2, 4, pool_size=90, max_running=8, overlap=True
        ).engine
    allocator, table = engine.scheduler.allocator, engine.scheduler.req_to_token_pool
    free_at_start, rows_at_start = allocator.available_size(), table.req_to_token.clone()
    generator = torch.Generator().manual_seed(12)

    def randint(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=generator))

    submitted: list[Request] = []
    aborted: set[int] = set()
    while len(submitted) < 1000 or engine.has_work():
        for _ in range(randint(0, 4) if len(submitted) < 1000 else 0):
            prompt = torch.randint(0, TINY.vocab_size, (randint(1, 25),), generator=generator)
            params = SamplingParams(
                randint(1, 17), temperature=float(randint(0, 2)), seed=len(submitted)
            )
            submitted.append(engine.submit(prompt.tolist(), params))
        if randint(0, 6) == 0:  # a queued, running, finishing or finished request
            victim = submitted[randint(0, len(submitted))]
            if engine.abort(victim.request_id):
                aborted.add(victim.request_id)
        engine.step()
    engine.step()  # reads the last step in flight (its tokens are all dropped)
    assert engine.stats.num_retracted > 10 and len(aborted) > 50
    assert_ran_ahead(engine)
    assert allocator.available_size() == free_at_start
    assert torch.equal(table.req_to_token, rows_at_start)
    assert table.available_size() == table.size
    for request in submitted:
        assert request.status is RequestStatus.FINISHED
        assert (request.finish_reason is FinishReason.ABORT) == (request.request_id in aborted)
        if request.request_id not in aborted:
            assert len(request.output_ids) == request.params.max_new_tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_under_retraction_greedy_tokens_match_and_seeded_samples_repeat(
    models: ModelCache, worker: str, temperature: float
) -> None:
    """A retracted request is prefilled again, which draws one coin where a verify step draws
    N + 1, so its later samples depend on the step it was retracted at; the overlapped engine
    decides retraction from lower bounds, possibly a step later. Greedy tokens do not depend on
    it, and seeded samples still repeat run after run. (A plain decode step draws one coin, as
    a prefill does, so its samples do not depend on retraction at all.)"""
    loaded = models("llama", "eagle")
    prompts = prompts_for(8, seed=41)
    runs = []
    for overlap in (False, True, True):
        if worker == "plain":  # 60 slots: one request fits (≤ 12 + 16 + 2), eight do not
            engine = plain_engine(loaded, pool_size=60, max_running=8, overlap=overlap)
        else:  # 100 slots: one request fits (≤ 12 + 16 tokens + 16 reserved), eight do not
            engine = speculative_engine(
                loaded, 3, 2, 4, pool_size=100, max_running=8, overlap=overlap
            ).engine
        results = engine.generate(prompts, MAX_NEW, temperature=temperature, seed=9)
        runs.append([(r.output_ids, r.finish_reason) for r in results])
        assert engine.stats.num_retracted > 0
        assert engine.scheduler.allocator.available_size() == engine.scheduler.allocator.size
    assert_ran_ahead(engine)
    assert runs[1] == runs[2]
    if temperature == 0.0 or worker == "plain":
        assert runs[0] == runs[1]
