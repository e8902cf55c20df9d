"""row_argmax against ``torch.argmax``: the same index, first maximum on ties, at every width
around its chunk size."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.kernels.triton.row_argmax import BLOCK, row_argmax
from tests.conftest import requires_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 905])
def test_row_argmax_equals_torch_argmax_with_ties_and_infinities(
    device: torch.device, dtype: torch.dtype, width: int
) -> None:
    requires_triton(device)
    generator = torch.Generator().manual_seed(width)
    # few distinct values: most rows hold their maximum several times, across chunks
    logits = torch.randint(-4, 4, (9, width), generator=generator).to(dtype)
    logits[0] = float("-inf")  # all equal: index 0
    logits[1, -1] = 100.0  # the maximum in the last (ragged) column
    logits[2] = torch.randn(width, generator=generator).to(dtype)  # a distinct maximum
    logits = logits.to(device)
    assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))


def test_no_rows_give_no_indices_and_bad_shapes_are_refused(device: torch.device) -> None:
    requires_triton(device)
    assert row_argmax(torch.zeros(0, 5, device=device)).shape == (0,)
    with pytest.raises(ValueError, match="V ≥ 1"):
        row_argmax(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="unit column stride"):
        row_argmax(torch.zeros(5, 3).t())
