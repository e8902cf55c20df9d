"""Hypothesis strategies for the domain tests: draft beams with exact ties, random trees, paths.

Sizes come from hypothesis (so failures shrink to small shapes); bulk values come from a seeded
``torch.Generator`` / ``random.Random`` whose seed hypothesis draws, which keeps examples cheap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import strategies as st

from .brute_force.tree import child_lists, links_from_child_lists

# how the draft probabilities of one example are drawn; all but "continuous" produce exact ties
PROBABILITY_MODES = ("palette", "quantised", "all_equal", "with_ones", "continuous", "sorted")
PALETTE = (0.5, 0.25, 0.25, 0.125)


@dataclass(frozen=True)
class DraftCase:
    """The raw draft-model outputs of S beam steps for bs requests."""

    bs: int
    topk: int
    num_steps: int
    num_draft_tokens: int
    mode: str
    seq_lens: torch.Tensor  # (bs,) int64 committed lengths L_b
    verified_id: torch.Tensor  # (bs,) int64 root tokens
    step_probs: list[torch.Tensor]  # step 0: (bs, k); step i >= 1: (bs·k, k) float32
    step_tokens: list[torch.Tensor]  # same shapes, int64
    step_hidden: list[torch.Tensor]  # step 0: (bs, H); step i >= 1: (bs·k, H) float32


def draft_probs(mode: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Draft top-k probabilities in (0, 1] drawn the way ``mode`` says."""
    if mode == "palette":
        palette = torch.tensor(PALETTE)
        return palette[torch.randint(len(PALETTE), shape, generator=gen)]
    if mode == "quantised":
        return torch.randint(1, 9, shape, generator=gen).float() / 8
    if mode == "all_equal":
        return torch.full(shape, 0.5)
    if mode == "with_ones":  # p == 1 makes a child tie with its parent
        return torch.where(torch.rand(shape, generator=gen) < 0.5, 1.0, 0.5)
    values = torch.rand(shape, generator=gen).clamp(min=1e-3)
    if mode == "sorted":  # what a real top-k returns: each row descending
        values = values.sort(dim=-1, descending=True).values
    return values


@st.composite
def draft_cases(draw: st.DrawFn, max_bs: int = 5) -> DraftCase:
    bs = draw(st.integers(0, max_bs))
    k = draw(st.integers(1, 8))
    steps = draw(st.integers(1, 6))
    n = draw(st.integers(2, min(64, k + (steps - 1) * k * k + 1)))
    mode = draw(st.sampled_from(PROBABILITY_MODES))
    vocab = draw(st.integers(2, 40))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    hidden_size = 3
    shapes = [(bs, k)] + [(bs * k, k)] * (steps - 1)
    return DraftCase(
        bs=bs,
        topk=k,
        num_steps=steps,
        num_draft_tokens=n,
        mode=mode,
        seq_lens=torch.randint(0, 13, (bs,), generator=gen),
        verified_id=torch.randint(vocab, (bs,), generator=gen),
        step_probs=[draft_probs(mode, s, gen) for s in shapes],
        step_tokens=[torch.randint(vocab, s, generator=gen) for s in shapes],
        step_hidden=[torch.randn((s[0], hidden_size), generator=gen) for s in shapes],
    )


# --- random trees ---------------------------------------------------------------------------


def random_parents(num_nodes: int, max_depth: int, rng: random.Random) -> list[int]:
    """A random rooted tree in topological node order (parent < child), depth <= max_depth."""
    parents, depth = [-1], [0]
    for _ in range(1, num_nodes):
        choices = [i for i in range(len(parents)) if depth[i] < max_depth]
        parent = rng.choice(choices)
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return parents


def shuffled_links(parents: list[int], rng: random.Random) -> tuple[list[int], list[int]]:
    """Child links whose sibling order is a random permutation (not increasing index)."""
    children = child_lists(parents)
    for kids in children:
        rng.shuffle(kids)
    return links_from_child_lists(children)


def distinct_sibling_tokens(parents: list[int], vocab: int, rng: random.Random) -> list[int]:
    """A token per node, distinct among siblings (as one top-k produces them)."""
    by_node = [0] * len(parents)
    by_node[0] = rng.randrange(vocab)
    for kids in child_lists(parents):
        for kid, token in zip(kids, rng.sample(range(vocab), len(kids)), strict=True):
            by_node[kid] = token
    return by_node


def random_path(parents: list[int], max_drafts: int, rng: random.Random) -> list[int]:
    """A root-first path that walks down random children for up to ``max_drafts`` steps."""
    children = child_lists(parents)
    path = [0]
    for _ in range(rng.randint(0, max_drafts)):
        if not children[path[-1]]:
            break
        path.append(rng.choice(children[path[-1]]))
    return path


@dataclass(frozen=True)
class TreeBatch:
    """bs random trees of N nodes, their links (maybe shuffled) and a random accepted path each."""

    num_steps: int
    num_draft_tokens: int
    parents: list[list[int]]
    next_token: list[list[int]]
    next_sibling: list[list[int]]
    paths: list[list[int]]  # local node ids, root first


@st.composite
def tree_batches(draw: st.DrawFn, min_bs: int = 0, max_nodes: int = 24) -> TreeBatch:
    """Random trees; some are deeper than S (build_tree never makes those, but the verifiers
    take any links and must stop after S accepted drafts)."""
    bs = draw(st.integers(min_bs, 5))
    steps = draw(st.integers(1, 6))
    n = draw(st.integers(2, max_nodes))
    shuffle = draw(st.booleans())
    max_depth = steps + draw(st.sampled_from([0, 0, 1, 2]))
    rng = random.Random(draw(st.integers(0, 2**31 - 1)))
    parents = [random_parents(n, max_depth, rng) for _ in range(bs)]
    links = [
        shuffled_links(p, rng) if shuffle else links_from_child_lists(child_lists(p))
        for p in parents
    ]
    return TreeBatch(
        num_steps=steps,
        num_draft_tokens=n,
        parents=parents,
        next_token=[nt for nt, _ in links],
        next_sibling=[ns for _, ns in links],
        paths=[random_path(p, steps, rng) for p in parents],
    )


# --- devices --------------------------------------------------------------------------------

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]
