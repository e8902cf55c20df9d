"""Shared layers: rotary frequencies equal transformers' for every supported scaling, and the
interleaved rotation is DeepSeek's pairwise rotation laid out de-interleaved."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eagletree.adapters.models.config import RopeConfig
from eagletree.adapters.models.layers import RMSNorm
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding, rope_inverse_frequencies

ROPES: list[dict[str, Any]] = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    },
    {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    },
]


def ours(params: dict[str, Any]) -> RopeConfig:
    fields = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}
    return RopeConfig(theta=params["rope_theta"], rope_type=params["rope_type"], **fields)


@pytest.mark.hf
@pytest.mark.parametrize("params", ROPES, ids=lambda p: p["rope_type"])
@pytest.mark.parametrize("dim", [16, 64, 128])
def test_inverse_frequencies_and_attention_factor_equal_transformers(
    params: dict[str, Any], dim: int
) -> None:
    transformers = pytest.importorskip("transformers")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    config = transformers.LlamaConfig(
        hidden_size=4 * dim,
        num_attention_heads=4,
        head_dim=dim,
        max_position_embeddings=4096 * 40,
        rope_parameters=dict(params),
    )
    if params["rope_type"] == "default":
        want, want_factor = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim)), 1.0
    else:
        want, want_factor = rope_utils.ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    inv_freq, factor = rope_inverse_frequencies(ours(params), dim)
    torch.testing.assert_close(inv_freq, want, rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)


def test_interleaved_rotation_is_the_complex_pairwise_rotation_de_interleaved() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 8, generator=generator)
    angles = torch.randn(5, 4, generator=generator)
    tables = RopeTables(
        torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin(), True
    )
    pairs = torch.view_as_complex(x.view(5, 3, 4, 2).contiguous())
    turned = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)[:, None])
    want = torch.cat((turned[..., 0], turned[..., 1]), dim=-1)
    torch.testing.assert_close(tables.rotate(x), want)


def test_half_split_rotation_turns_dimension_j_with_j_plus_half() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 8, generator=generator)
    angles = torch.randn(5, 4, generator=generator)
    tables = RopeTables(
        torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin(), False
    )
    pairs = torch.complex(x[..., :4], x[..., 4:])
    turned = pairs * torch.polar(torch.ones_like(angles), angles)[:, None]
    torch.testing.assert_close(tables.rotate(x), torch.cat((turned.real, turned.imag), -1))


def test_rotation_preserves_norms_and_scores_depend_only_on_the_offset() -> None:
    generator = torch.Generator().manual_seed(2)
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), 16, interleaved=True)
    q, k = torch.randn(1, 1, 16, generator=generator), torch.randn(1, 1, 16, generator=generator)

    def tables(position: int, dtype: torch.dtype) -> RopeTables:
        result: RopeTables = rotary(torch.tensor([position]), dtype)
        return result

    def score(p_q: int, p_k: int) -> torch.Tensor:
        rq = tables(p_q, torch.float64).rotate(q.double())
        rk = tables(p_k, torch.float64).rotate(k.double())
        return (rq * rk).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100))
    rotated = tables(9, torch.float32).rotate(q)
    torch.testing.assert_close(rotated.norm(), q.norm())


@pytest.mark.parametrize("params", ROPES, ids=lambda p: p["rope_type"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tables_are_each_table_computed_and_cast_on_its_own(
    params: dict[str, Any], dtype: torch.dtype
) -> None:
    # the tables share one buffer and one cast; their values are transformers' order of
    # operations: fp32 angles of both halves, cos / sin, the attention factor, then the dtype
    rope = ours(params)
    rotary = RotaryEmbedding(rope, 64)
    positions = torch.randint(0, 200_000, (37,), generator=torch.Generator().manual_seed(4))
    inv_freq, factor = rope_inverse_frequencies(rope, 64)
    freqs = positions[:, None].float() * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    tables = rotary(positions, dtype)
    assert torch.equal(tables.cos, (angles.cos() * factor).to(dtype))
    assert torch.equal(tables.sin, (angles.sin() * factor).to(dtype))
    assert tables.cos.stride() == tables.sin.stride() == (64, 1)  # what the fused kernels read


@pytest.mark.hf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(32, generator=generator).to(dtype)
    x = (torch.randn(7, 32, generator=generator) * 3).to(dtype)
    theirs, mine = llama.LlamaRMSNorm(32, eps=1e-5).to(dtype), RMSNorm(32, 1e-5).to(dtype)
    with torch.no_grad():
        theirs.weight.copy_(weight)
        mine.weight.copy_(weight)
        torch.testing.assert_close(mine(x), theirs(x), rtol=0, atol=0)
