"""silu_and_mul against the SwiGLU reference ``silu(gate) * up`` (tolerances.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul
from tests.conftest import requires_triton
from tests.unit.kernels.tolerances import assert_computed_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [13, 0])
def test_silu_and_mul_equals_silu_of_gate_times_up(
    device: torch.device, dtype: torch.dtype, num_tokens: int
) -> None:
    requires_triton(device)
    generator = torch.Generator().manual_seed(9)
    # 2 × 1500 columns: more than one 1024-column block per row, the last one ragged
    gate_up = (3 * torch.randn(num_tokens, 3000, generator=generator)).to(device, dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_computed_close(silu_and_mul(gate_up), nn.functional.silu(gate) * up)


def test_an_odd_width_is_refused() -> None:
    with pytest.raises(ValueError, match="2·I"):
        silu_and_mul(torch.zeros(2, 7))
