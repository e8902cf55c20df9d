"""The split-KV merge against its torch reference, one row or several per program."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.kernels.triton import split_merge
from eagletree.adapters.kernels.triton.split_merge import (
    MAX_ROWS_PER_PROGRAM,
    ROWS_PER_PROGRAM_FROM,
    merge_splits,
    rows_per_program,
)
from tests.conftest import requires_triton
from tests.unit.kernels.tolerances import assert_computed_close


def reference(part_o: torch.Tensor, part_lse: torch.Tensor) -> torch.Tensor:
    """Σ_s 2^lse_s · o_s / Σ_s 2^lse_s per row; zeros where no split saw a key."""
    weight = torch.exp2(part_lse - part_lse.amax(-1, keepdim=True).nan_to_num(0.0, 0.0, 0.0))
    weight = weight.nan_to_num(0.0)
    total = weight.sum(-1, keepdim=True)
    merged = (part_o * weight[..., None]).sum(-2) / total.clamp_min(1e-30)
    return torch.where(total > 0, merged, torch.zeros_like(merged))


def test_rows_per_program_keeps_about_a_thousand_programs_and_is_a_power_of_two() -> None:
    assert [rows_per_program(n) for n in (1, 32, ROWS_PER_PROGRAM_FROM - 1)] == [1, 1, 1]
    assert rows_per_program(2 * ROWS_PER_PROGRAM_FROM) == 2
    assert rows_per_program(3 * ROWS_PER_PROGRAM_FROM) == 2
    assert rows_per_program(8192) == 8 == MAX_ROWS_PER_PROGRAM
    assert rows_per_program(1 << 20) == MAX_ROWS_PER_PROGRAM


@pytest.mark.parametrize(
    ("tokens", "heads", "splits", "dtype", "rows_from"),
    [
        (1, 32, 32, torch.float32, None),
        (3, 5, 3, torch.bfloat16, None),
        # several rows per program (4, the last program ragged with 3) from a lowered threshold:
        # the real one needs over 2048 rows, over 1024 programs (12 s in the Triton interpreter)
        (7, 5, 2, torch.float32, 8),
    ],
)
def test_the_merge_equals_the_log_sum_exp_weighted_mean_of_the_splits(
    device: torch.device,
    monkeypatch: pytest.MonkeyPatch,
    tokens: int,
    heads: int,
    splits: int,
    dtype: torch.dtype,
    rows_from: int | None,
) -> None:
    requires_triton(device)
    if rows_from is not None:
        monkeypatch.setattr(split_merge, "ROWS_PER_PROGRAM_FROM", rows_from)
        assert rows_per_program(tokens * heads) > 1  # the case the test exists for
    generator = torch.Generator().manual_seed(tokens * heads + splits)
    part_o = torch.randn(tokens, heads, splits, 24, generator=generator)
    part_lse = torch.randn(tokens, heads, splits, generator=generator) * 4
    part_lse[0, 0, :] = float("-inf")  # a row that saw no key in any split
    part_lse[-1, -1, :-1] = float("-inf")  # a row that saw keys in its last split only
    out = torch.empty(tokens, heads, 24, dtype=dtype, device=device)
    merge_splits(part_o.to(device), part_lse.to(device), out)
    expected = reference(part_o, part_lse)
    assert_computed_close(out.cpu(), expected.to(dtype))
    assert (out[0, 0] == 0).all()
