"""mla_rope_kv_store against MLAAttention's torch path: RMSNorm of the latent, RopeTables.rotate
of q_rope and k_rope (both layouts), MLAKVPool.set_kv_buffer of [latent; k_rope]."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.kernels.triton.mla_rope_kv_store import mla_rope_kv_store
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models.config import RopeConfig
from eagletree.adapters.models.layers import RMSNorm
from eagletree.adapters.models.rotary import RotaryEmbedding
from tests.conftest import requires_triton
from tests.unit.kernels.tolerances import assert_computed_close

HEADS, NOPE, RANK, ROPE, SLOTS = 3, 8, 40, 12, 40  # rank 40 and half-rope 6: masked blocks


@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [13, 0])
def test_mla_rope_kv_store_matches_the_torch_prologue(
    device: torch.device, dtype: torch.dtype, interleaved: bool, num_tokens: int
) -> None:
    requires_triton(device)
    generator = torch.Generator().manual_seed(12)
    q = (3 * torch.randn(num_tokens, HEADS, NOPE + ROPE, generator=generator)).to(device, dtype)
    compressed = (3 * torch.randn(num_tokens, RANK + ROPE, generator=generator)).to(device, dtype)
    q_rope, latent, k_rope = q[..., NOPE:], compressed[:, :RANK], compressed[:, RANK:]
    norm = RMSNorm(RANK, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(RANK, generator=generator))
    norm = norm.to(device, dtype)
    positions = torch.randint(0, 500, (num_tokens,), generator=generator).to(device)
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), ROPE, interleaved=interleaved)
    rope = rotary.to(device)(positions, dtype)
    loc = (torch.randperm(SLOTS, generator=generator)[:num_tokens] + 1).to(device)

    def pool() -> MLAKVPool:
        return MLAKVPool(SLOTS, 2, RANK, ROPE, dtype, device, TorchRowMover())

    expected = pool()
    k = torch.cat((norm(latent)[:, None, :], rope.rotate(k_rope[:, None, :])), dim=-1)
    expected.set_kv_buffer(1, loc, k)
    ours = pool()
    q_out = mla_rope_kv_store(
        q_rope, latent, k_rope, norm.weight, norm.eps, rope.cos, rope.sin, interleaved, loc,
        ours.get_kv_buffer(1),
    )  # fmt: skip

    scale = float(compressed.abs().max()) if num_tokens else 0.0
    assert q_out.shape == (num_tokens, HEADS, RANK + ROPE)
    assert_computed_close(q_out[..., RANK:], rope.rotate(q_rope), scale)
    rows, expected_rows = ours.get_kv_buffer(1), expected.get_kv_buffer(1)
    assert_computed_close(rows[..., :RANK], expected_rows[..., :RANK])
    assert_computed_close(rows[..., RANK:], expected_rows[..., RANK:], scale)
    untouched = torch.ones(SLOTS + 1, dtype=torch.bool, device=device)
    untouched[loc] = False
    assert not rows.float()[untouched].any()
    assert not ours.get_kv_buffer(0).float().any()
