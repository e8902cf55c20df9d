"""EagleWorkerV2 sampling is lossless: the first three sampled tokens of 20,000
requests follow the target's exact distribution (chi-square), with a random and an
oracle draft, temperature, top-k and top-p, trees of top-k drafts and chains and trees whose
drafts are drawn from the draft."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.domain.sampling import probs_from_logits
from tests.integration.models.harness import Memory, Requests, make_backend, make_pool
from tests.integration.spec.eagle_v2.engines import ModelCache
from tests.integration.spec.harness import (
    SIZES,
    SpecEngine,
    SpecModels,
    greedy_outputs,
    plain_engine,
    speculative_engine,
)
from tests.integration.spec.oracle_draft import OracleDraft

# one small layer: 20,000 sampled requests run its forward; the distribution test does not
# depend on the model's size (three layers of 64 doubled its time)
TINY_VOCAB = dataclasses.replace(
    SIZES,
    vocab_size=8,
    draft_vocab_size=8,
    num_layers=1,
    hidden_size=32,
    intermediate_size=48,
    num_heads=2,
    num_kv_heads=1,
)
NUM_SAMPLES = 20_000


def exact_first_three_tokens(
    models: SpecModels,
    prompt: list[int],
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> torch.Tensor:
    """P(t1, t2, t3) (V, V, V) of the target after ``prompt``, from one EXTEND of every prefix."""
    vocab = TINY_VOCAB.vocab_size
    grid = torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab)).tolist()
    sequences = [prompt] + [[*prompt, a] for a in range(vocab)] + [[*prompt, *ab] for ab in grid]
    memory = Memory(
        models.device,
        num_slots=sum(len(s) for s in sequences) + 1,
        max_requests=len(sequences),
        row_width=len(prompt) + 4,
    )
    pool = make_pool(models.target.kv_layout, memory.allocator.size, models.dtype, models.device)
    runner = TargetModelRunner(
        models.target,
        pool,
        memory.req_to_token_pool,
        make_backend("torch", pool, memory.req_to_token_pool),
    )
    batch = Requests(memory, len(sequences)).extend(sequences)
    last_rows = torch.cumsum(torch.tensor([len(s) for s in sequences]), 0) - 1
    logits = runner.forward(batch, last_rows.to(models.device)).logits.double().cpu()
    rows = logits.shape[0]
    probs = probs_from_logits(
        logits,
        torch.full((rows,), temperature),
        None if top_k is None else torch.full((rows,), top_k),
        None if top_p is None else torch.full((rows,), top_p),
    ).double()
    p1 = probs[0]  # (V,)
    p2 = probs[1 : 1 + vocab]  # (V, V): [t1, t2]
    p3 = probs[1 + vocab :].view(vocab, vocab, vocab)  # [t1, t2, t3]
    return p1.view(vocab, 1, 1) * p2.view(vocab, vocab, 1) * p3


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's test; cells expecting < 5 samples are pooled into one."""
    total = observed.sum()
    expected = expected_probs.flatten() * total
    observed = observed.flatten().double()
    small = expected < 5
    cells_observed = torch.cat([observed[~small], observed[small].sum().view(1)])
    cells_expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    statistic = ((cells_observed - cells_expected) ** 2 / cells_expected.clamp_min(1e-12)).sum()
    dof = torch.tensor((cells_expected > 0).sum().item() - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic / 2))


@pytest.mark.parametrize(
    ("config", "oracle", "temperature", "top_k", "top_p", "draw"),
    [
        ((3, 6, 16), False, 1.0, None, None, False),
        ((3, 4, 8), True, 0.7, 6, 0.95, False),
        ((3, 1, 4), False, 1.0, None, None, True),
        ((2, 1, 3), True, 0.7, 6, 0.95, True),
        ((3, 4, 8), False, 1.0, None, None, True),
        ((3, 3, 7), True, 0.7, 6, 0.95, True),
    ],
    ids=[
        "S3k6N16-random-draft-t1",
        "S3k4N8-oracle-t0.7-topk6-topp0.95",
        "drawn-chain-S3-random-draft-t1",
        "drawn-chain-S2-oracle-t0.7-topk6-topp0.95",
        "drawn-tree-S3k4N8-random-draft-t1",
        "drawn-tree-S3k3N7-oracle-t0.7-topk6-topp0.95",
    ],
)
def test_sampled_first_three_tokens_follow_the_target_distribution(
    spec_models: ModelCache,
    config: tuple[int, int, int],
    oracle: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    draw: bool,
) -> None:
    device = torch.device("cpu")
    models = spec_models("llama", "eagle", device, sizes=TINY_VOCAB)
    prompt = [1, 2, 3]
    options: dict[str, object] = {"max_running": 1000, "pool_size": 40_000}
    if oracle:  # proposes the greedy path, which sampling at t = 0.7 often follows
        [greedy] = greedy_outputs(plain_engine(models), [prompt], 8)
        sequence = [*prompt, *greedy]
        options["wrap_draft"] = lambda d: OracleDraft(d, lambda row: sequence, config[1])
    options["draw_drafts"] = draw  # drafts drawn from the draft: rejection sampling
    spec = speculative_engine(models, *config, **options)  # type: ignore[arg-type]
    assert_first_three_follow_the_target(spec, models, prompt, temperature, top_k, top_p)


def test_a_drawn_chain_over_part_of_the_vocabulary_samples_the_target_distribution(
    spec_models: ModelCache,
) -> None:
    # an EAGLE-3 head proposing 5 of the 8 tokens: it never draws the other 3, which the
    # target then emits from the residual only (three layers: EAGLE-3 reads three of them)
    sizes = dataclasses.replace(TINY_VOCAB, draft_vocab_size=5, num_layers=3)
    models = spec_models("llama", "eagle3", torch.device("cpu"), sizes=sizes)
    spec = speculative_engine(models, 2, 1, 3, max_running=1000, pool_size=40_000, draw_drafts=True)
    assert spec.draft.token_ids is not None and spec.draft.token_ids.numel() == 5
    assert_first_three_follow_the_target(spec, models, [1, 2, 3], 1.0, None, None)


def assert_first_three_follow_the_target(
    spec: SpecEngine,
    models: SpecModels,
    prompt: list[int],
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> None:
    """NUM_SAMPLES requests of ``prompt`` sample three tokens each; their joint counts pass the
    chi-square test against the target's exact distribution, and both outcomes of a verify
    step (a draft accepted, a bonus from the residual) are frequent."""
    results = spec.engine.generate(
        [prompt] * NUM_SAMPLES, 3, temperature=temperature, top_k=top_k, top_p=top_p, seed=0
    )
    vocab = TINY_VOCAB.vocab_size
    observed = torch.zeros(vocab, vocab, vocab)
    for result in results:
        a, b, c = result.output_ids
        observed[a, b, c] += 1
    exact = exact_first_three_tokens(models, prompt, temperature, top_k, top_p)
    assert int(observed[exact == 0].sum()) == 0  # nothing outside top-k / top-p
    p_value = chi_square_p_value(observed, exact)
    stats = spec.engine.stats.acceptance
    assert stats is not None
    print(f"chi-square p = {p_value:.4f}, acceptance {stats}")
    # both outcomes of a verify step are frequent: a drafted child accepted, or the residual
    assert stats.histogram[1] > NUM_SAMPLES // 20 and sum(stats.histogram[2:]) > NUM_SAMPLES // 20
    assert p_value > 1e-3
