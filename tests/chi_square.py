"""Test support: Pearson's chi-square test of observed counts against expected ones."""

from __future__ import annotations

import torch


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test, cells with an expected count below 5 pooled; p from gammaincc."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)]).double()
    exp = torch.cat([expected[~small], expected[small].sum().view(1)]).double()
    keep = exp > 0
    statistic = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = torch.tensor((int(keep.sum()) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2))


def markov_p_value(sequences: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
    """Sequences of three tokens emitted after token 0 (draws, 3) against a Markov chain's
    joint distribution of them (``target`` (V, V) row-stochastic): (Pearson's p, how many
    sequences had probability 0)."""
    vocab = target.shape[0]
    code = (sequences[:, 0] * vocab + sequences[:, 1]) * vocab + sequences[:, 2]
    observed = torch.bincount(code, minlength=vocab**3).double()
    joint = target[0][:, None, None] * target[:, :, None] * target[None, :, :]
    expected = sequences.shape[0] * joint.flatten().double()
    return chi_square_p_value(observed, expected), int(observed[expected == 0].sum())
