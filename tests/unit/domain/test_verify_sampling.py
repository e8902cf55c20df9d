"""Tests of target-only tree sampling: exact given its coins, and lossless in distribution."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.domain.sampling import probs_from_logits, sample_from_probs
from eagletree.domain.verify import verify_tree_greedy, verify_tree_sampling
from tests.hypothesis_profiles import examples

from .brute_force.tree import child_lists, links_from_child_lists
from .brute_force.verification import inverse_cdf, probs_reference, verify_sampling_reference
from .strategies import DEVICES, TreeBatch, distinct_sibling_tokens, tree_batches


def link_tensors(trees: TreeBatch, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    bs, n = len(trees.parents), trees.num_draft_tokens
    retrieve_index = torch.arange(bs * n, device=device).view(bs, n)
    next_token = torch.tensor(trees.next_token, dtype=torch.int64, device=device).view(bs, n)
    next_sibling = torch.tensor(trees.next_sibling, dtype=torch.int64, device=device).view(bs, n)
    return retrieve_index, next_token, next_sibling


def dyadic_probs(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Distributions whose entries are multiples of 1/64, some exactly zero: every partial sum
    is exact in float32, so the brute force sees the very same comparisons."""
    weights = torch.randint(0, 4, (rows, vocab), generator=gen) ** 2
    weights[:, 0] += 1  # no empty row
    units = torch.multinomial(weights.float(), 64, replacement=True, generator=gen)  # (rows, 64)
    counts = torch.zeros((rows, vocab)).scatter_add_(1, units, torch.ones(rows, 64))
    return counts / 64


def edgy_coins(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Uniform coins in [0, 1) mixed with 0, the largest float32 below 1, and multiples of 1/64
    (which hit cumulative-probability boundaries exactly)."""
    uniform = torch.rand(shape, generator=gen)
    boundary = torch.randint(0, 64, shape, generator=gen).float() / 64
    pick = torch.randint(0, 4, shape, generator=gen)
    edge = torch.where(pick == 2, 0.0, 1.0 - 2.0**-24)
    return torch.where(pick == 0, uniform, torch.where(pick == 1, boundary, edge))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(150), deadline=None)
@given(trees=tree_batches(min_bs=1), seed=st.integers(0, 2**31 - 1))
def test_sampling_verification_equals_the_brute_force_given_the_coins(
    device: str, trees: TreeBatch, seed: int
) -> None:
    bs, n, steps = len(trees.parents), trees.num_draft_tokens, trees.num_steps
    vocab = max(6, n)  # siblings need distinct tokens
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    candidates = [distinct_sibling_tokens(p, vocab, rng) for p in trees.parents]
    probs = dyadic_probs(bs * n, vocab, gen).view(bs, n, vocab)
    coins, final_coins = edgy_coins((bs, n), gen), edgy_coins((bs,), gen)
    retrieve_index, next_token, next_sibling = link_tensors(trees, device)
    result = verify_tree_sampling(
        torch.tensor(candidates, dtype=torch.int64, device=device).view(bs, n),
        retrieve_index,
        next_token,
        next_sibling,
        probs.to(device),
        coins.to(device),
        final_coins.to(device),
        steps,
    )
    reference = verify_sampling_reference(
        candidates,
        retrieve_index.tolist(),
        trees.next_token,
        trees.next_sibling,
        probs.tolist(),
        coins.tolist(),
        final_coins.tolist(),
        steps,
    )
    assert result.predict.dtype == result.accept_index.dtype == torch.int32
    assert result.accept_length.dtype == torch.int32
    assert result.predict.tolist() == reference.predict
    assert result.accept_index.tolist() == reference.accept_index
    assert result.accept_length.tolist() == reference.accept_length


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(60), deadline=None)
@given(trees=tree_batches(min_bs=1), seed=st.integers(0, 2**31 - 1))
def test_sampling_at_temperature_zero_is_greedy_verification(
    device: str, trees: TreeBatch, seed: int
) -> None:
    bs, n, steps = len(trees.parents), trees.num_draft_tokens, trees.num_steps
    vocab = max(6, n)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    candidates = torch.tensor(
        [distinct_sibling_tokens(p, vocab, rng) for p in trees.parents], dtype=torch.int64
    ).view(bs, n)
    # logits that often favour a child's token, so that paths get accepted
    logits = torch.randn((bs, n, vocab), generator=gen)
    logits.scatter_add_(2, candidates.roll(-1, dims=1).unsqueeze(2), torch.full((bs, n, 1), 2.0))
    probs = probs_from_logits(logits.view(bs * n, vocab), torch.zeros(bs * n)).view(bs, n, vocab)
    retrieve_index, next_token, next_sibling = link_tensors(trees, device)
    sampled = verify_tree_sampling(
        candidates.to(device),
        retrieve_index,
        next_token,
        next_sibling,
        probs.to(device),
        torch.rand((bs, n), generator=gen).to(device),
        torch.rand((bs,), generator=gen).to(device),
        steps,
    )
    greedy = verify_tree_greedy(
        candidates.to(device),
        retrieve_index,
        next_token,
        next_sibling,
        logits.argmax(dim=2).to(device),
        steps,
    )
    assert sampled.predict.tolist() == greedy.predict.tolist()
    assert sampled.accept_index.tolist() == greedy.accept_index.tolist()
    assert sampled.accept_length.tolist() == greedy.accept_length.tolist()


# --- losslessness ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LosslessCase:
    """A fixed tree and a target whose distribution depends only on the path's tokens."""

    parents: list[int]
    tokens: list[int]  # node tokens, root first, distinct among siblings
    num_steps: int
    vocab: int
    boost: float  # added to the target logits of a node's drafted children: a good draft
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    sibling_order: str = "increasing"


DEEP_AND_WIDE = [-1, 0, 0, 0, 1, 1, 3, 4, 2, 8]
DEEP_AND_WIDE_TOKENS = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2]
LOSSLESS_CASES = {
    "chain, full acceptance likely": LosslessCase([-1, 0, 1, 2], [0, 1, 2, 3], 3, 6, 4.0),
    "one-draft chain, bonus after full acceptance": LosslessCase([-1, 0], [0, 3], 1, 6, 3.0),
    # deeper than S: the bonus after S accepted drafts may be the drafted child's token
    "chain deeper than S, bonus from the full row": LosslessCase([-1, 0, 1], [0, 3, 4], 1, 6, 3.0),
    "wide root": LosslessCase([-1, 0, 0, 0, 0, 0], [5, 0, 1, 2, 3, 4], 1, 7, 0.5),
    "wide root, reversed sibling links": LosslessCase(
        [-1, 0, 0, 0, 0, 0], [5, 0, 1, 2, 3, 4], 2, 7, 1.0, sibling_order="reversed"
    ),
    "deep and wide": LosslessCase(DEEP_AND_WIDE, DEEP_AND_WIDE_TOKENS, 3, 8, 1.0),
    "deep and wide, temperature, top-k, top-p": LosslessCase(
        DEEP_AND_WIDE, DEEP_AND_WIDE_TOKENS, 3, 8, 1.0, temperature=0.7, top_k=5, top_p=0.9
    ),
}
NUM_DRAWS = 20_000


def paths_of(case: LosslessCase) -> list[tuple[int, ...]]:
    """The token path (root first) that ends at every node."""
    paths: list[tuple[int, ...]] = []
    for i, parent in enumerate(case.parents):
        paths.append((case.tokens[i],) if parent < 0 else (*paths[parent], case.tokens[i]))
    return paths


def target_probs(case: LosslessCase, paths: list[tuple[int, ...]]) -> torch.Tensor:
    """The target's next-token distribution after each token path → (len(paths), V)."""
    node_of_path = {p: i for i, p in enumerate(paths_of(case))}
    children = child_lists(case.parents)
    rows = []
    for path in paths:
        rng = random.Random(repr(path))  # the same path always gets the same logits
        logits = [rng.gauss(0.0, 1.0) for _ in range(case.vocab)]
        for kid in children[node_of_path[path]] if path in node_of_path else []:
            logits[case.tokens[kid]] += case.boost
        rows.append(logits)
    count = len(paths)
    return probs_from_logits(
        torch.tensor(rows),
        torch.full((count,), case.temperature),
        torch.full((count,), case.top_k),
        torch.full((count,), case.top_p),
    )


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test, cells with an expected count below 5 pooled; p from gammaincc."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)]).double()
    exp = torch.cat([expected[~small], expected[small].sum().view(1)]).double()
    keep = exp > 0
    statistic = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = torch.tensor((int(keep.sum()) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(LOSSLESS_CASES))
def test_the_first_two_emitted_tokens_follow_the_target_distribution(
    device: str, name: str
) -> None:
    case = LOSSLESS_CASES[name]
    n, vocab, bs = len(case.parents), case.vocab, NUM_DRAWS
    gen = torch.Generator().manual_seed(len(name))
    node_probs = target_probs(case, paths_of(case))  # (N, V)
    root = case.tokens[0]
    second_probs = target_probs(case, [(root, t) for t in range(vocab)])  # (V, V) row = t1
    children = child_lists(case.parents)
    if case.sibling_order == "reversed":
        children = [kids[::-1] for kids in children]
    next_token, next_sibling = links_from_child_lists(children)

    def repeated(row: list[int]) -> torch.Tensor:
        return torch.tensor(row, device=device).expand(bs, n).contiguous()

    result = verify_tree_sampling(
        repeated(case.tokens),
        torch.arange(bs * n, device=device).view(bs, n),
        repeated(next_token),
        repeated(next_sibling),
        node_probs.to(device).expand(bs, n, vocab),
        torch.rand((bs, n), generator=gen).to(device),
        torch.rand((bs,), generator=gen).to(device),
        case.num_steps,
    )
    predict = result.predict.long().cpu()
    accept_index = result.accept_index.long().cpu()
    accepted_drafts = result.accept_length.cpu()
    first = predict[accept_index[:, 0]]
    second_in_step = predict[accept_index[:, 1].clamp(min=0)]
    # a step that emitted one token: its successor comes from the target itself (next step)
    second_next_step = torch.multinomial(second_probs[first], 1, generator=gen).squeeze(1)
    second = torch.where(accepted_drafts >= 1, second_in_step, second_next_step)

    observed = torch.bincount(first * vocab + second, minlength=vocab * vocab).double()
    expected = bs * (node_probs[0].unsqueeze(1) * second_probs).flatten().double()
    assert observed[expected == 0].sum() == 0, "a token of probability 0 was emitted"
    assert chi_square_p_value(observed, expected) > 1e-3
    if "chain" in name:  # the case is meant to exercise full acceptance
        assert (accepted_drafts == case.num_steps).float().mean() > 0.3


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_batch_gives_empty_results(device: str) -> None:
    n, steps, vocab = 4, 3, 6
    links = torch.empty((0, n), dtype=torch.int64, device=device)
    result = verify_tree_sampling(
        links,
        links,
        links,
        links,
        torch.empty((0, n, vocab), device=device),
        torch.empty((0, n), device=device),
        torch.empty((0,), device=device),
        steps,
    )
    assert result.predict.shape == (0,)
    assert result.accept_index.shape == (0, steps + 1)
    assert result.accept_length.shape == (0,)


# --- the sampling helpers -------------------------------------------------------------------


@settings(max_examples=examples(150), deadline=None)
@given(
    vocab=st.integers(2, 10),
    rows=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    use_top_k=st.booleans(),
    use_top_p=st.booleans(),
)
def test_probs_from_logits_applies_temperature_then_top_k_then_top_p(
    vocab: int, rows: int, seed: int, use_top_k: bool, use_top_p: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((rows, vocab), generator=gen) * 2
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.7])[torch.randint(4, (rows,), generator=gen)]
    top_k = torch.randint(0, vocab + 3, (rows,), generator=gen)
    top_p = torch.where(torch.rand(rows, generator=gen) < 0.3, 1.0, torch.rand(rows, generator=gen))
    probs = probs_from_logits(
        logits, temperature, top_k if use_top_k else None, top_p if use_top_p else None
    )
    assert probs.dtype == torch.float32 and probs.shape == (rows, vocab)
    for r in range(rows):
        expected = probs_reference(
            logits[r].tolist(),
            float(temperature[r]),
            int(top_k[r]) if use_top_k else 0,
            float(top_p[r]) if use_top_p else 1.0,
        )
        got = probs[r].tolist()
        assert [p > 0 for p in got] == [p > 0 for p in expected], (r, got, expected)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_top_p_is_measured_on_the_top_k_renormalised_distribution() -> None:
    # softmax = [0.4, 0.3, 0.2, 0.1]; top-k 2 leaves [4/7, 3/7]; top-p 0.5 then keeps token 0
    # alone (4/7 >= 0.5), as top_k_renorm → top_p_renorm does in SGLang
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    probs = probs_from_logits(logits, torch.ones(1), torch.tensor([2]), torch.tensor([0.5]))
    expected = probs_reference(logits[0].tolist(), 1.0, 2, 0.5)
    assert expected == [1.0, 0.0, 0.0, 0.0]
    assert probs[0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize("device", DEVICES)
def test_neutral_filters_keep_every_token_and_leave_the_softmax_bit_for_bit(device: str) -> None:
    # three equal heads and a tail: the float32 running sum of the sorted probabilities reaches
    # 1.0 before the tail, which "mass before < top_p" alone would drop at top_p = 1
    spread = torch.cat([torch.full((3,), 15.0), torch.linspace(5.0, -15.0, 37)])
    logits = spread.expand(4, 40).to(device)
    temperature = torch.full((4,), 0.8, device=device)
    softmax = torch.softmax(logits / 0.8, dim=1)
    neutral_k = torch.tensor([0, 40, 41, 0], device=device)  # 0 and >= V keep all
    neutral_p = torch.tensor([1.0, 1.0, 1.5, 1.0], device=device)
    for top_k, top_p in [(neutral_k, None), (None, neutral_p), (neutral_k, neutral_p)]:
        probs = probs_from_logits(logits, temperature, top_k, top_p)
        assert torch.equal(probs, softmax)
        assert bool((probs > 0).all())


@settings(max_examples=examples(150), deadline=None)
@given(vocab=st.integers(1, 9), rows=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_sample_from_probs_is_the_inverse_cdf_and_never_returns_a_zero_probability_token(
    vocab: int, rows: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    # unnormalised dyadic weights with zeros (also leading and trailing), sometimes all zero
    weights = (torch.randint(0, 5, (rows, vocab), generator=gen) ** 2).float() / 8
    weights[torch.rand(rows, generator=gen) < 0.1] = 0.0
    coins = edgy_coins((rows,), gen)
    tokens = sample_from_probs(weights, coins)
    expected = [inverse_cdf(w, c) for w, c in zip(weights.tolist(), coins.tolist(), strict=True)]
    assert tokens.tolist() == expected
    for row, token in zip(weights.tolist(), tokens.tolist(), strict=True):
        assert row[token] > 0 or not any(row)
