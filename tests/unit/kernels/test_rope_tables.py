"""rope_tables against RotaryEmbedding's torch path.

The tolerance is in units of the last place (ulps, counted across zero), not a relative one:
fp32 cos/sin within 4 ulps of torch's (the two libms differ by an ulp or two, and the attention
factor's multiply can add one more rounding); bf16/fp16 tables equal to torch's or one ulp
apart (a pre-cast difference of an ulp can flip a rounding, and the CPU interpreter truncates
its bf16 casts). That fails on a dropped attention factor (9 % and more here), on swapped
columns or cos for sin, and on an approximate cos/sin: positions go up to 131072 and the first
column's frequency is about 1, so its angle is the position itself.
"""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.kernels.triton.rope_tables import rope_tables
from eagletree.adapters.models.config import RopeConfig
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding
from tests.conftest import requires_triton

MAX_POSITION = 131072

# every scaling rotary.py supports; both YaRN cases have an attention factor other than 1
ROPES = {
    "default": RopeConfig(theta=10000.0),
    "linear": RopeConfig(theta=10000.0, rope_type="linear", factor=4.0),
    "llama3": RopeConfig(
        theta=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
    "yarn-mscale": RopeConfig(  # the factor: the ratio of two mscales, 1.086
        theta=10000.0,
        rope_type="yarn",
        factor=40.0,
        original_max_position_embeddings=4096,
        mscale=1.0,
        mscale_all_dim=0.707,
    ),
    "yarn-given-factor": RopeConfig(
        theta=10000.0,
        rope_type="yarn",
        factor=4.0,
        original_max_position_embeddings=64,
        attention_factor=0.8,
    ),
}
MAX_ULPS = {torch.float32: 4, torch.bfloat16: 1, torch.float16: 1}


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Each float's bit pattern as an integer that counts ulps from zero (negative below)."""
    bits = t.view(torch.int32 if t.element_size() == 4 else torch.int16).long()
    magnitude = bits & ((1 << (8 * t.element_size() - 1)) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def assert_tables_close(ours: RopeTables, reference: RopeTables) -> None:
    assert ours.interleaved == reference.interleaved
    for table, want in ((ours.cos, reference.cos), (ours.sin, reference.sin)):
        assert table.dtype == want.dtype and table.shape == want.shape
        assert table.stride() == want.stride()  # rows of dim columns, what the fused kernels read
        if table.numel():
            ulps = (ordered(table) - ordered(want)).abs().max().item()
            assert ulps <= MAX_ULPS[want.dtype], f"{ulps} ulps apart"


def random_positions(num_tokens: int, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=generator)
    if num_tokens:
        positions[-1] = MAX_POSITION - 1  # the largest angle, whatever the draw
    return positions.to(device)


@pytest.mark.parametrize("rope", ROPES.values(), ids=ROPES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [0, 1, 37])  # 37: two blocks of 16 rows and a ragged one
@pytest.mark.parametrize("dim", [64, 24])  # 24: a 32-wide block with masked columns
@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
def test_fused_tables_are_the_torch_paths_to_an_ulp(
    device: torch.device,
    rope: RopeConfig,
    dtype: torch.dtype,
    num_tokens: int,
    dim: int,
    interleaved: bool,
) -> None:
    requires_triton(device)
    positions = random_positions(num_tokens, device, seed=num_tokens + dim)
    reference = RotaryEmbedding(rope, dim, interleaved).to(device)
    fused = RotaryEmbedding(rope, dim, interleaved, fused_kernels=True).to(device)
    assert_tables_close(fused(positions, dtype), reference(positions, dtype))


def test_the_kernel_refuses_float_positions_and_non_fp32_frequencies() -> None:
    freq = torch.ones(8)
    with pytest.raises(ValueError, match="integer positions"):
        rope_tables(torch.zeros(3), freq, 1.0, torch.float32)
    with pytest.raises(ValueError, match="fp32 column frequencies"):
        rope_tables(torch.zeros(3, dtype=torch.int64), freq.half(), 1.0, torch.float32)
