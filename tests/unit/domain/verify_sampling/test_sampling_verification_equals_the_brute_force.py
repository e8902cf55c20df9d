"""Target-only tree sampling is exact given its coins: equal to the brute force, equal
to greedy verification at temperature zero, and empty on an empty batch."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.domain.sampling import probs_from_logits
from eagletree.domain.verify import verify_tree_greedy, verify_tree_sampling
from tests.hypothesis_profiles import examples

from ..brute_force.verification import verify_sampling_reference
from ..strategies import DEVICES, TreeBatch, distinct_sibling_tokens, tree_batches
from .draws import dyadic_probs, edgy_coins, link_tensors


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
