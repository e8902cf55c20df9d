"""Inputs for the sampling-verification tests: a tree batch's link tensors, dyadic
distributions whose partial sums are exact in float32, and coins on the edges."""

from __future__ import annotations

import torch

from ..strategies import TreeBatch


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
