"""`eagletree train-draft` end to end on the CPU: EAGLE and EAGLE-3 heads trained for
the tiny target are accepted far more often than random heads of the same shape,
measured through the real engine (chains, trees, fresh contexts, sampling, speed
rows), with the output lossless."""

from __future__ import annotations

import random

import pytest

from benchmarks.real_pair.speed import measure_speed
from benchmarks.real_pair.table import TableInputs, lookup_table, measure_head, shape_grid
from eagletree.app.training import acceptance, acceptance_row
from eagletree.app.training.data import prompt_windows
from tests.integration.train_draft.pair import (
    MIN_FRESH,
    MIN_MARGIN,
    MIN_SAMPLED,
    MIN_TRAINED_CHAIN,
    NEW_TOKENS,
    PROMPT_LEN,
    SHAPES,
    Pair,
    Trained,
    held_out_prompts,
    held_out_tokens,
    random_head,
    random_head_acceptance,
)


@pytest.mark.hf
@pytest.mark.parametrize("algorithm", ["eagle", "eagle3"])
def test_a_trained_head_is_accepted_far_more_often_than_a_random_one(
    pair: Pair, algorithm: str, trained: Trained
) -> None:
    _, report = trained(algorithm)
    losses = report["losses"]
    assert len(losses) == 300
    assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:20]) / 20
    rows = {row["shape"]: row for row in report["acceptance"] if row["temperature"] == 0.0}
    random_rows = {row.shape.label: row for row in random_head_acceptance(pair, algorithm)}
    for shape in SHAPES:
        row, baseline = rows[shape.label], random_rows[shape.label]
        # the engine loaded the head (Engine.from_settings) and stayed lossless
        assert row["matches_plain"] is True
        assert row["num_verify_steps"] > 0
        assert baseline.mean_accept_length < 1.2
        assert row["mean_accept_length"] >= baseline.mean_accept_length + MIN_MARGIN
    assert rows["chain S=3"]["mean_accept_length"] >= MIN_TRAINED_CHAIN
    # trained unrolled: the head agrees with the target on its own features at depth 3 too,
    # on held-out text
    assert report["agreement_source"] == "held-out"
    accuracy = report["agreement_by_step"]
    assert len(accuracy) == 3 and min(accuracy) > 0.7


@pytest.mark.hf
def test_the_acceptance_table_measures_chains_trees_fresh_contexts_and_sampling(
    pair: Pair, trained: Trained
) -> None:
    head, _ = trained("eagle3")
    prompts = held_out_prompts(pair)
    reference = acceptance.plain_outputs(pair.target, prompts, NEW_TOKENS, "cpu")
    contexts = prompt_windows(held_out_tokens(pair)[PROMPT_LEN // 2 :], 12, PROMPT_LEN)
    inputs = TableInputs(pair.target, prompts, reference, contexts, NEW_TOKENS, "cpu", seed=3)
    grid = shape_grid([3], [8], [4])
    assert grid == [acceptance_row.TreeShape.chain(3), acceptance_row.TreeShape(3, 4, 8)]
    table = measure_head(inputs, head, "eagle3", grid, budget_s=600)
    assert not table.not_measured
    assert [row.shape for row in table.greedy] == grid
    assert all(row.matches_plain and row.match_rate == 1.0 for row in table.greedy)
    # fresh contexts: exactly one verify step each, and the trained head accepts there too
    assert [row.shape for row in table.fresh] == grid
    for row in table.fresh:
        assert row.num_verify_steps == len(contexts)
        assert row.mean_accept_length >= MIN_FRESH
    assert [(row.shape, row.temperature) for row in table.sampled] == [(s, 1.0) for s in grid]
    assert all(row.matches_plain is None for row in table.sampled)
    assert min(row.mean_accept_length for row in table.sampled) >= MIN_SAMPLED
    random_fresh = acceptance.first_step_acceptance(
        pair.target, random_head(pair, "eagle3"), "eagle3", contexts, grid[0], "cpu"
    )
    assert random_fresh.mean_accept_length < 1.2
    lookup = lookup_table(inputs, [3])
    assert lookup[0].matches_plain and lookup[0].num_verify_steps > 0
    # a spent budget measures nothing and says so
    none = measure_head(inputs, head, "eagle3", grid, budget_s=0.0)
    assert not (none.greedy or none.fresh or none.sampled)
    assert none.not_measured == [f"greedy {shape.label}" for shape in grid]


@pytest.mark.hf
def test_the_pairs_speed_rows_carry_the_heads_acceptance(pair: Pair, trained: Trained) -> None:
    head, _ = trained("eagle3")
    # a grammar prompt the head drafts well beside random bytes it cannot: the first request
    # races ahead, and must not run out of tokens before the second has its window's worth
    noise = random.Random(1).choices(range(256), k=PROMPT_LEN)
    prompts = [held_out_prompts(pair)[0], noise]
    shapes = [None, acceptance_row.TreeShape.chain(3), acceptance_row.TreeShape(3, 4, 8)]
    rows = measure_speed(pair.target, head, "eagle3", shapes, prompts, [1, 2], 24, "cpu")
    assert [(r.config, r.batch_size) for r in rows] == [
        (label, bs) for label in ("plain", "chain S=3", "tree S=3 k=4 N=8") for bs in (1, 2)
    ]
    assert all(r.tokens_per_s > 0 and r.ms_per_step > 0 for r in rows)
    assert all(r.tokens_per_step == 1.0 for r in rows if r.config == "plain")
    # the grammar prompt alone (bs 1): the speculative rows emit several tokens a step
    assert min(r.tokens_per_step for r in rows if r.config != "plain" and r.batch_size == 1) >= (
        MIN_FRESH
    )
