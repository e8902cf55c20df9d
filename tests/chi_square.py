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
