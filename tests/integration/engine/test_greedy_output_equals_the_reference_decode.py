"""Engine greedy parity on the fake runner: ragged batches, requests arriving while
others decode, EOS and stop ids, and the context length."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.batch import ForwardMode
from eagletree.domain.request import FinishReason
from tests.integration.engine.fake_engines import PROMPTS, _params, fake_engine, slots_in_use


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
