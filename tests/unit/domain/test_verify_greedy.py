"""Tests of greedy tree verification against the brute-force walk over the child links."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.domain.verify import VerifyResult, verify_tree_greedy
from tests.conftest import requires_triton
from tests.hypothesis_profiles import examples

from .brute_force.tree import child_lists, links_from_child_lists
from .brute_force.verification import VerifyReference, verify_greedy_reference
from .strategies import DEVICES, TreeBatch, tree_batches

Links = tuple[list[int], list[int]]
Verify = Callable[..., VerifyResult]
# the torch reference and the one-launch Triton walk must give the same answers everywhere
IMPLEMENTATIONS = ["torch", "triton"]


def implementation(name: str, device: str) -> Verify:
    if name == "torch":
        return verify_tree_greedy
    requires_triton(device)
    from eagletree.adapters.kernels.triton.tree_verify import verify_tree_greedy as triton_verify

    return triton_verify


def verify_both(
    device: str,
    links: list[Links],
    candidates: list[list[int]],
    target: list[list[int]],
    num_steps: int,
    num_nodes: int,
    verify: Verify = verify_tree_greedy,
) -> tuple[VerifyResult, VerifyReference]:
    bs = len(links)
    retrieve_index = [[b * num_nodes + i for i in range(num_nodes)] for b in range(bs)]
    next_token = [nt for nt, _ in links]
    next_sibling = [ns for _, ns in links]

    def tensor(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64, device=device).view(bs, num_nodes)

    result = verify(
        tensor(candidates),
        tensor(retrieve_index),
        tensor(next_token),
        tensor(next_sibling),
        tensor(target),
        num_steps,
    )
    reference = verify_greedy_reference(
        candidates, retrieve_index, next_token, next_sibling, target, num_steps
    )
    return result, reference


def assert_equal(result: VerifyResult, reference: VerifyReference, bs: int, steps: int) -> None:
    assert result.predict.dtype == torch.int32
    assert result.accept_index.dtype == torch.int32
    assert result.accept_length.dtype == torch.int32
    assert tuple(result.accept_index.shape) == (bs, steps + 1)
    assert result.predict.tolist() == reference.predict
    assert result.accept_index.tolist() == reference.accept_index
    assert result.accept_length.tolist() == reference.accept_length


def biased_target(
    parents: list[int], tokens: list[int], vocab: int, rng: random.Random
) -> list[int]:
    """The target's argmax after every node: mostly one of the node's children's tokens."""
    children = child_lists(parents)
    return [
        tokens[rng.choice(kids)] if kids and rng.random() < 0.8 else rng.randrange(vocab)
        for kids in children
    ]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_verification_equals_the_brute_force_on_random_trees(impl: str, device: str) -> None:
    verify = implementation(impl, device)
    # the Triton walk under the CPU interpreter costs ~0.1 s a batch: 60 examples there, as the
    # other interpreted property tests (tree build, beam step), 200 everywhere else
    interpreted = impl == "triton" and device == "cpu"

    @settings(max_examples=examples(60 if interpreted else 200), deadline=None)
    @given(trees=tree_batches(), vocab=st.integers(2, 12), seed=st.integers(0, 2**31 - 1))
    def check(trees: TreeBatch, vocab: int, seed: int) -> None:
        rng = random.Random(seed)
        n = trees.num_draft_tokens
        # a small vocabulary makes equal sibling tokens common: the link order must decide
        candidates = [[rng.randrange(vocab) for _ in range(n)] for _ in trees.parents]
        target = [
            biased_target(p, c, vocab, rng) for p, c in zip(trees.parents, candidates, strict=True)
        ]
        links = list(zip(trees.next_token, trees.next_sibling, strict=True))
        steps = trees.num_steps
        result, reference = verify_both(device, links, candidates, target, steps, n, verify)
        assert_equal(result, reference, len(trees.parents), steps)

    check()


# Constructed cases share N = 8 and S = 3 so that they also run together as one batch.
N, S = 8, 3
# root 0 → {1, 2, 3}; 1 → {4, 5}; 3 → {6}; 4 → {7}
WIDE = [-1, 0, 0, 0, 1, 1, 3, 4]
WIDE_TOKENS = [9, 10, 11, 12, 13, 14, 15, 16]
CHAIN = [-1, 0, 1, 2, 3, 4, 5, 6]  # deeper than S: acceptance stops after S drafts
CHAIN_TOKENS = [20, 21, 22, 23, 24, 25, 26, 27]


def increasing(parents: list[int]) -> Links:
    return links_from_child_lists(child_lists(parents))


def ordered(parents: list[int], order: dict[int, list[int]]) -> Links:
    children = child_lists(parents)
    for node, kids in order.items():
        assert sorted(kids) == children[node]
        children[node] = kids
    return links_from_child_lists(children)


def target_along(path: list[int], tokens: list[int], miss: int = 99) -> list[int]:
    """The target wants each next node of ``path``, and ``miss`` everywhere else."""
    target = [miss] * len(tokens)
    for here, after in itertools.pairwise(path):
        target[here] = tokens[after]
    target[path[-1]] = 77  # the bonus
    return target


CASES = {
    "full depth on the chain": (increasing(CHAIN), CHAIN_TOKENS, [0, 1, 2, 3], S),
    "full depth through a side branch": (increasing(WIDE), WIDE_TOKENS, [0, 1, 4, 7], S),
    "a non-first sibling at the root": (increasing(WIDE), WIDE_TOKENS, [0, 3, 6], 2),
    "a non-first sibling below the root": (increasing(WIDE), WIDE_TOKENS, [0, 1, 5], 2),
    "rejection at the root": (increasing(WIDE), WIDE_TOKENS, [0], 0),
    "shuffled sibling order": (ordered(WIDE, {0: [3, 1, 2], 1: [5, 4]}), WIDE_TOKENS, [0, 1, 5], 2),
}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_constructed_paths_are_accepted_exactly(impl: str, device: str, name: str) -> None:
    verify = implementation(impl, device)
    links, tokens, path, expected_length = CASES[name]
    target = target_along(path, tokens)
    result, reference = verify_both(device, [links], [tokens], [target], S, N, verify)
    assert_equal(result, reference, 1, S)
    assert result.accept_length.tolist() == [expected_length]
    assert result.accept_index.tolist() == [path + [-1] * (S + 1 - len(path))]
    # the emitted tokens: the accepted drafts, then the target's own choice (the bonus)
    emitted = [result.predict[i].item() for i in path]
    assert emitted == [tokens[i] for i in path[1:]] + [77]
    assert sum(p != -1 for p in result.predict.tolist()) == len(path)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_constructed_cases_give_the_same_answers_batched(impl: str, device: str) -> None:
    verify = implementation(impl, device)
    cases = list(CASES.values())
    links = [c[0] for c in cases]
    tokens = [c[1] for c in cases]
    targets = [target_along(c[2], c[1]) for c in cases]
    result, reference = verify_both(device, links, tokens, targets, S, N, verify)
    assert_equal(result, reference, len(cases), S)
    assert result.accept_length.tolist() == [c[3] for c in cases]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_equal_sibling_tokens_are_resolved_by_the_link_order_not_the_index_order(
    impl: str, device: str
) -> None:
    verify = implementation(impl, device)
    # nodes 1 and 2 both carry token 5; their children differ, so which one is taken shows
    parents = [-1, 0, 0, 1, 2, 0, 0, 0]
    tokens = [0, 5, 5, 6, 7, 8, 9, 10]
    target = [5, 99, 7, 99, 42, 99, 99, 99]  # after token 5 the target wants 7: node 2's child
    for order, expected_path in (([1, 2, 5, 6, 7], [0, 1]), ([2, 1, 5, 6, 7], [0, 2, 4])):
        links = ordered(parents, {0: order})
        result, reference = verify_both(device, [links], [tokens], [target], S, N, verify)
        assert_equal(result, reference, 1, S)
        assert result.accept_index.tolist() == [expected_path + [-1] * (S + 1 - len(expected_path))]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_batch_gives_empty_results(impl: str, device: str) -> None:
    empty = torch.empty((0, N), dtype=torch.int64, device=device)
    result = implementation(impl, device)(empty, empty, empty, empty, empty, S)
    assert result.predict.shape == (0,)
    assert result.accept_index.shape == (0, S + 1)
    assert result.accept_length.shape == (0,)
