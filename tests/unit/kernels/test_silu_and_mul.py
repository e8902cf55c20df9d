"""silu_and_mul against the SwiGLU reference ``silu(gate) * up`` (tolerances.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul
from tests.conftest import requires_triton
from tests.unit.kernels.tolerances import assert_computed_close, rounded_like_torch


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_folded_norm_scales_gate_and_up_by_the_streams_inverse_rms(
    device: torch.device, dtype: torch.dtype
) -> None:
    requires_triton(device)
    generator = torch.Generator().manual_seed(10)
    gate_up = (3 * torch.randn(5, 3000, generator=generator)).to(device, dtype)
    # 5000 wide: two blocks of the statistic's loop (NORM_BLOCK 4096), the last one ragged
    stream = (7 * torch.randn(5, 5000, generator=generator)).to(device, dtype)
    eps = 1e-5
    inverse_rms = torch.rsqrt(stream.float().pow(2).mean(-1, keepdim=True) + eps)
    gate, up = (gate_up.float() * inverse_rms).to(dtype).chunk(2, dim=-1)
    out = silu_and_mul(gate_up, norm_of=stream, eps=eps)
    expected = nn.functional.silu(gate) * up
    if rounded_like_torch(device, dtype):
        assert_computed_close(out, expected)
    else:  # the interpreter truncates the two extra roundings too: up to twice the error
        torch.testing.assert_close(out, expected, rtol=2**-5, atol=1e-5)
    with pytest.raises(ValueError, match="norm_of must be"):
        silu_and_mul(gate_up, norm_of=stream[:4], eps=eps)


def test_an_odd_width_is_refused() -> None:
    with pytest.raises(ValueError, match="2·I"):
        silu_and_mul(torch.zeros(2, 7))
