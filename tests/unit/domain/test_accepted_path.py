"""The ranks and offers along an accepted path: a constructed tree and random trees against a
brute-force walk, for the torch reference and the Triton kernel; a chain's from its accept
length alone against the reference."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.domain.accepted_path import accepted_path_ranks, chain_path_ranks
from tests.conftest import requires_triton
from tests.hypothesis_profiles import examples

from .brute_force.tree import child_lists
from .strategies import DEVICES, TreeBatch, tree_batches

PathRanks = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def implementation(impl: str, device: str) -> PathRanks:
    if impl == "torch":
        return accepted_path_ranks
    requires_triton(device)
    from eagletree.adapters.kernels.triton.path_ranks import accepted_path_ranks as kernel

    return kernel


# root 0 → {1, 2, 3}; 1 → {4, 5}; 3 → {6}; 4 → {7}
WIDE = [-1, 0, 0, 0, 1, 1, 3, 4]


def path_tensors(
    paths: list[list[int]], n: int, num_steps: int, device: str = "cpu"
) -> tuple[torch.Tensor, ...]:
    index = torch.full((len(paths), num_steps + 1), -1, dtype=torch.int32)
    for b, path in enumerate(paths):
        index[b, : len(path)] = torch.tensor(path, dtype=torch.int32) + b * n
    length = torch.tensor([len(p) - 1 for p in paths], dtype=torch.int32)
    return index.to(device), length.to(device)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("device", DEVICES)
def test_ranks_and_offers_along_constructed_paths(impl: str, device: str) -> None:
    parents = torch.tensor([WIDE, WIDE, WIDE], device=device)
    # 0 → 1 → 5 (rank 1 under node 1); 0 → 3 (rank 2); nothing accepted
    index, length = path_tensors([[0, 1, 5], [0, 3], [0]], 8, 3, device)
    observed = implementation(impl, device)(parents, index, length)
    ranks, offered = observed[:, :3], observed[:, 3:]
    assert observed.dtype == torch.int64 and observed.shape == (3, 6)
    assert ranks.tolist() == [[0, 1, -1], [2, -1, -1], [-1, -1, -1]]
    # offers: root has 3 children, node 1 two, node 5 none (the path ended: 0 offered)
    assert offered.tolist() == [[3, 2, 0], [3, 1, 0], [3, 0, 0]]


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(100), deadline=None)
@given(trees=tree_batches())
def test_ranks_and_offers_equal_a_walk_down_the_path(
    impl: str, device: str, trees: TreeBatch
) -> None:
    s, n = trees.num_steps, trees.num_draft_tokens
    parents = torch.tensor(trees.parents, dtype=torch.int64, device=device)
    index, length = path_tensors(trees.paths, n, s, device)
    observed = implementation(impl, device)(parents.view(len(trees.parents), n), index, length)
    ranks, offered = observed[:, :s].cpu(), observed[:, s:].cpu()
    for b, (tree, path) in enumerate(zip(trees.parents, trees.paths, strict=True)):
        children = child_lists(tree)
        want_ranks = [children[path[d]].index(path[d + 1]) for d in range(len(path) - 1)]
        want_offered = [len(children[node]) for node in path]
        assert ranks[b].tolist() == (want_ranks + [-1] * s)[:s]
        assert offered[b].tolist() == (want_offered + [0] * s)[:s]


@settings(max_examples=examples(50), deadline=None)
@given(num_steps=st.integers(1, 8), data=st.data())
def test_a_chains_ranks_and_offers_follow_from_its_accept_length(
    num_steps: int, data: st.DataObject
) -> None:
    lengths = data.draw(st.lists(st.integers(0, num_steps), min_size=1, max_size=6))
    chain = list(range(-1, num_steps))  # node d + 1 under node d
    parents = torch.tensor([chain] * len(lengths))
    index, length = path_tensors([list(range(a + 1)) for a in lengths], num_steps + 1, num_steps)
    observed = accepted_path_ranks(parents, index, length)
    assert [chain_path_ranks(a, num_steps) for a in lengths] == observed.tolist()
