"""The row exchange of dense layers sharded over a data-parallel group, with the collective
replaced: every rank's rows padded to the group's largest count and gathered in rank order, a
row-wise layer over the gathered rows, and each rank's own block kept, equal that layer over
the rank's own rows; a group with no rows anywhere calls no collective."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.models.dense_group import (
    DenseGroup,
    RowCounts,
    gather_padded,
    own_rows,
    pad_rows,
)
from eagletree.adapters.models.tensor_parallel import SINGLE


def ranks_inputs(counts: tuple[int, ...], width: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(n, width, generator=generator) for n in counts]


@pytest.mark.parametrize("counts", [(2, 0, 3), (1, 1, 1), (0, 4, 0), (5, 2, 5)])
def test_gathered_rows_through_a_layer_give_each_rank_its_own_rows(counts: tuple[int, ...]) -> None:
    inputs = ranks_inputs(counts, width=6, seed=sum(counts))
    padded = max(counts)
    layer = torch.nn.Linear(6, 4)
    calls = []
    for rank, x in enumerate(inputs):
        rows = RowCounts(counts, rank)

        def all_gather(mine: torch.Tensor, rank: int = rank) -> list[torch.Tensor]:
            calls.append(rank)
            assert mine.shape == (padded, 6)
            return [
                mine if r == rank else pad_rows(other, padded) for r, other in enumerate(inputs)
            ]

        gathered = gather_padded(x, rows, all_gather)
        assert gathered.shape == (len(counts) * padded, 6)
        for other, (n, part) in enumerate(zip(counts, inputs, strict=True)):
            block = gathered[other * padded : (other + 1) * padded]
            torch.testing.assert_close(block[:n], part, rtol=0, atol=0)
            assert torch.count_nonzero(block[n:]) == 0  # the padding is zeros
        with torch.no_grad():
            torch.testing.assert_close(own_rows(layer(gathered), rows), layer(x))
    assert calls == list(range(len(counts)))  # one collective per rank


def test_a_group_without_rows_calls_no_collective() -> None:
    def all_gather(mine: torch.Tensor) -> list[torch.Tensor]:
        raise AssertionError("no collective for a forward with no rows anywhere")

    rows = RowCounts((0, 0), 1)
    gathered = gather_padded(torch.empty(0, 3), rows, all_gather)
    assert gathered.shape == (0, 3)
    assert own_rows(gathered, rows).shape == (0, 3)


def test_pad_rows_appends_zero_rows_and_keeps_a_full_tensor() -> None:
    x = torch.arange(6.0).view(2, 3)
    assert pad_rows(x, 2) is x
    padded = pad_rows(x, 4)
    torch.testing.assert_close(padded[:2], x)
    torch.testing.assert_close(padded[2:], torch.zeros(2, 3))


def test_a_dense_layer_refuses_rows_its_forward_did_not_start_with() -> None:
    group = DenseGroup(SINGLE, count_group=None)
    with pytest.raises(RuntimeError, match="its embedding must run first"):
        group.forward_rows(3)
    assert group.start_forward(3) == RowCounts((3,), 0)
    assert group.forward_rows(3).own == 3
    with pytest.raises(RuntimeError, match="got 2 rows, but the forward in progress started wi"):
        group.forward_rows(2)
