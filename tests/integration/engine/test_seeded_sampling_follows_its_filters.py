"""Engine sampling on the fake runner: seeded per request whatever shares its batch,
greedy with top-k 1 or a tiny top-p, and inside the top-k."""

from __future__ import annotations

import torch

from tests.integration.engine.fake_engines import PROMPTS, fake_engine


def test_seeded_sampling_does_not_depend_on_the_other_requests_of_the_batch() -> None:
    engine, _ = fake_engine()
    together = engine.generate(PROMPTS, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    # request 2 of the call samples with seed 7 + 2, whatever shares its batches
    alone = fake_engine()[0].generate([PROMPTS[2]], 12, temperature=1.0, top_p=0.9, seed=9)
    assert alone[0].output_ids == together[2].output_ids
    again = fake_engine()[0].generate(PROMPTS, 12, temperature=1.0, top_p=0.9, seed=7)
    assert [r.output_ids for r in again] == [r.output_ids for r in together]
    other = fake_engine()[0].generate(PROMPTS, 12, temperature=1.0, top_p=0.9, seed=8)
    assert [r.output_ids for r in other] != [r.output_ids for r in together]


def test_sampling_with_top_k_1_or_a_tiny_top_p_is_greedy() -> None:
    engine, runner = fake_engine()
    for results in (
        engine.generate(PROMPTS, 8, temperature=2.0, top_k=1, seed=1),
        engine.generate(PROMPTS, 8, temperature=2.0, top_p=1e-6, seed=1),
    ):
        assert [r.output_ids for r in results] == [runner.greedy_reference(p, 8) for p in PROMPTS]


def test_sampled_tokens_stay_inside_the_top_k_of_the_reference_distribution() -> None:
    engine, runner = fake_engine()
    [result] = engine.generate([PROMPTS[0]], 16, temperature=1.5, top_k=3, seed=3)
    tokens = list(PROMPTS[0])
    for token in result.output_ids:
        allowed = torch.topk(runner.reference_logits(tokens), 3).indices.tolist()
        assert token in allowed
        tokens.append(token)
    assert len(set(result.output_ids)) > 1
