"""rope_kv_store against RopeTables.rotate and MHAKVPool.set_kv_buffer (tolerances.py).

q and k are computed; v is copied, so the pool's V buffer must equal the reference bit for bit
(fp8 pools are refused: they keep set_kv_buffer).
"""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.kernels.triton.rope_kv_store import rope_kv_store
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models.config import RopeConfig
from eagletree.adapters.models.kv_rows import mha_kv_buffers
from eagletree.adapters.models.rotary import RotaryEmbedding
from tests.conftest import requires_triton
from tests.unit.kernels.tolerances import assert_computed_close

Q_HEADS, KV_HEADS, HEAD_DIM, SLOTS = 6, 2, 24, 40  # a half of 12 columns: masked blocks


def pool(dtype: torch.dtype, store: torch.dtype, device: torch.device) -> MHAKVPool:
    return MHAKVPool(
        SLOTS, 2, KV_HEADS, HEAD_DIM, HEAD_DIM, dtype, device, TorchRowMover(), store_dtype=store
    )


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


CASES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)]


# heads per program: one; 4 (the second block holds q heads 4, 5 and both kv heads); the
# default; 16 (half the block past the last head)
HEAD_BLOCKS = [1, 4, None, 16]


@pytest.mark.parametrize(("dtype", "store"), CASES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_tokens", [13, 0])
@pytest.mark.parametrize("heads", HEAD_BLOCKS)
def test_rope_kv_store_rotates_q_and_writes_the_pool_rows_set_kv_buffer_writes(
    device: torch.device, dtype: torch.dtype, store: torch.dtype, num_tokens: int, heads: int | None
) -> None:
    requires_triton(device)
    generator = torch.Generator().manual_seed(11)
    width = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    # one merged qkv row per token, as the model's qkv_proj gives; |v| up to ~600 tests saturation
    qkv = (torch.randn(num_tokens, width, generator=generator) * 150).to(device, dtype)
    q, k, v = torch.split(qkv, [Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    q = q.view(num_tokens, Q_HEADS, HEAD_DIM)
    k = k.view(num_tokens, KV_HEADS, HEAD_DIM)
    v = v.view(num_tokens, KV_HEADS, HEAD_DIM)
    positions = torch.randint(0, 500, (num_tokens,), generator=generator).to(device)
    rope_config = RopeConfig(theta=10000.0)
    rope = RotaryEmbedding(rope_config, HEAD_DIM).to(device)(positions, dtype)
    loc = (torch.randperm(SLOTS, generator=generator)[:num_tokens] + 1).to(device)

    expected = pool(dtype, store, device)
    expected.set_kv_buffer(1, loc, rope.rotate(k), v)
    ours = pool(dtype, store, device)
    buffers = ours.get_key_buffer(1), ours.get_value_buffer(1)
    q_rotated = rope_kv_store(q, k, v, rope.cos, rope.sin, loc, *buffers, heads=heads)

    scale = float(qkv.abs().max()) if num_tokens else 0.0
    assert_computed_close(q_rotated, rope.rotate(q), scale)
    assert torch.equal(as_bits(ours.get_value_buffer(1)), as_bits(expected.get_value_buffer(1)))
    keys, expected_keys = ours.get_key_buffer(1), expected.get_key_buffer(1)
    assert_computed_close(keys, expected_keys, scale)
    untouched = torch.ones(SLOTS + 1, dtype=torch.bool, device=device)
    untouched[loc] = False
    assert not ours.get_key_buffer(1).float()[untouched].any()
    assert not ours.get_key_buffer(0).float().any()  # another layer's buffer is not written


@pytest.mark.parametrize(("dtype", "store"), CASES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads", [4, None])
def test_a_folded_norm_scales_q_k_and_v_by_the_streams_inverse_rms_first(
    device: torch.device, dtype: torch.dtype, store: torch.dtype, heads: int | None
) -> None:
    requires_triton(device)
    generator = torch.Generator().manual_seed(12)
    num_tokens, eps = 9, 1e-6
    q = (torch.randn(num_tokens, Q_HEADS, HEAD_DIM, generator=generator) * 40).to(device, dtype)
    k = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator) * 40).to(device, dtype)
    v = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator) * 40).to(device, dtype)
    # 5000 wide: two blocks of the statistic's loop (NORM_BLOCK 4096), the last one ragged
    stream = (torch.randn(num_tokens, 5000, generator=generator) * 5).to(device, dtype)
    positions = torch.randint(0, 500, (num_tokens,), generator=generator).to(device)
    rope = RotaryEmbedding(RopeConfig(theta=10000.0), HEAD_DIM).to(device)(positions, dtype)
    loc = (torch.randperm(SLOTS, generator=generator)[:num_tokens] + 1).to(device)
    inverse_rms = torch.rsqrt(stream.float().pow(2).mean(-1) + eps)[:, None, None]
    q_n, k_n, v_n = ((t.float() * inverse_rms).to(dtype) for t in (q, k, v))

    expected = pool(dtype, store, device)
    expected.set_kv_buffer(1, loc, rope.rotate(k_n), v_n)
    ours = pool(dtype, store, device)
    buffers = ours.get_key_buffer(1), ours.get_value_buffer(1)
    q_rotated = rope_kv_store(q, k, v, rope.cos, rope.sin, loc, *buffers, stream, eps, heads)

    scale = float(torch.cat([q_n.flatten(), k_n.flatten()]).abs().max())
    assert_computed_close(q_rotated, rope.rotate(q_n), scale)
    assert_computed_close(ours.get_key_buffer(1), expected.get_key_buffer(1), scale)
    assert_computed_close(ours.get_value_buffer(1), expected.get_value_buffer(1))
    with pytest.raises(ValueError, match="norm_of must be"):
        rope_kv_store(q, k, v, rope.cos, rope.sin, loc, *buffers, stream[:3], eps)


def test_mismatched_shapes_are_refused() -> None:
    q, k = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8)
    cos = torch.zeros(3, 8)
    buffer = torch.zeros(10, 2, 8)
    with pytest.raises(ValueError, match="shapes do not fit"):
        rope_kv_store(q, k, k, cos, cos, torch.zeros(2, dtype=torch.int64), buffer, buffer)


def test_fp8_pools_are_refused_and_left_to_set_kv_buffer() -> None:
    fp8 = pool(torch.bfloat16, torch.float8_e4m3fn, torch.device("cpu"))
    assert mha_kv_buffers(fp8, 1) is None  # the layer lets the backend store
    assert mha_kv_buffers(pool(torch.bfloat16, torch.bfloat16, torch.device("cpu")), 1) is not None
    q, k = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8)
    cos = torch.zeros(3, 8)
    loc = torch.ones(3, dtype=torch.int64)
    keys = torch.zeros(10, 2, 8, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="fp8 pools store through set_kv_buffer"):
        rope_kv_store(q, k, k, cos, cos, loc, keys, keys)


def test_a_head_block_that_is_not_a_power_of_two_is_refused() -> None:
    q, k = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8)
    cos = torch.zeros(3, 8)
    loc = torch.ones(3, dtype=torch.int64)
    keys = torch.zeros(10, 2, 8)
    with pytest.raises(ValueError, match="power of two, got 3"):
        rope_kv_store(q, k, k, cos, cos, loc, keys, keys, heads=3)
