"""Stop ids, EOS and max_new_tokens at every position of an accepted path (and of a
plain output) end a request exactly where the synchronous loop does, and the step
launched past the finish gives back every slot and the row."""

from __future__ import annotations

import pytest

from eagletree.app.engine.loop import Engine
from eagletree.domain.request import FinishReason
from tests.integration.spec.eagle_v2.engines import oracle_engine
from tests.integration.spec.harness import plain_engine
from tests.integration.spec.overlap.runs import ModelCache, assert_ran_ahead, prompts_for, summary


@pytest.mark.parametrize("stop", ["stop", "eos", "length"])
@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_stops_at_every_position_of_an_accepted_path_cut_it_as_the_synchronous_loop_does(
    models: ModelCache, stop: str, worker: str
) -> None:
    loaded = models("llama", "eagle")
    # a chain oracle emits exactly S + 1 = 4 tokens per verify step: 1 | 2..5 | 6..9 | 10..13
    config = (3, 1, 4)
    [prompt] = prompts_for(1, seed=31)
    _, _, [reference] = oracle_engine(loaded, config, [prompt], 14)

    def engine_for(eos: tuple[int, ...], overlap: bool) -> Engine:
        if worker == "plain":  # one token a step: a stop at any step of the run
            return plain_engine(loaded, eos_token_ids=eos, overlap=overlap)
        spec, _, _ = oracle_engine(loaded, config, [prompt], 14, eos_token_ids=eos, overlap=overlap)
        return spec.engine

    for cut in range(1, 10):  # the first token of a path, its middle ones, its last
        if stop != "length" and reference[cut] in reference[:cut]:
            continue  # an earlier copy of the token would stop first
        token = reference[cut]
        eos = (token,) if stop == "eos" else ()
        stop_ids = [token] if stop == "stop" else None
        max_new = cut + 1 if stop == "length" else 14
        outcomes = []
        for overlap in (False, True):
            engine = engine_for(eos, overlap)
            [result] = engine.generate([prompt], max_new, stop_token_ids=stop_ids)
            outcomes.append(summary([result]))
            assert result.output_ids == reference[: cut + 1]
            engine.close()  # reads the step launched past the finish: its tokens dropped
            # the step launched ahead of the finish wrote KV into the window only: every slot
            # and the row go back exactly once (the allocator checks double frees)
            allocator = engine.scheduler.allocator
            assert allocator.available_size() == allocator.size
            assert engine.scheduler.req_to_token_pool.req_to_token.eq(0).all()
        assert_ran_ahead(engine)
        assert outcomes[0] == outcomes[1]
        expected = {"stop": FinishReason.STOP, "eos": FinishReason.EOS}.get(
            stop, FinishReason.LENGTH
        )
        assert outcomes[1][0][1] is expected
