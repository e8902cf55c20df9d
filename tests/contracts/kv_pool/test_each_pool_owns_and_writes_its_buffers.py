"""What each pool kind owns and how it writes: ``buffers()`` lists every slot-indexed
tensor; MHA stores in its storage dtype, MLA latent and rope in one row, DSA indexer
keys and scales move with the latent."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from tests.contracts.kv_pool.pools import FP8, POOLS, make_pool, raw, slots


@pytest.mark.parametrize("pool_kind", POOLS)
def test_buffers_lists_every_slot_indexed_tensor(pool_kind: str, device: torch.device) -> None:
    pool = make_pool(pool_kind, TorchRowMover(), "bf16", device, layers=3)
    listed = {buf.data_ptr() for buf in pool.buffers()}
    assert len(listed) == len(pool.buffers())
    owned: list[torch.Tensor] = []
    for layer in range(pool.geometry.layer_num):
        if isinstance(pool, MHAKVPool):
            owned += [pool.get_key_buffer(layer), pool.get_value_buffer(layer)]
        if isinstance(pool, MLAKVPool | DSAKVPool):
            owned.append(pool.get_kv_buffer(layer))
        if isinstance(pool, DSAKVPool):
            owned += [pool.get_index_k_buffer(layer), pool.get_index_scale_buffer(layer)]
    assert {buf.data_ptr() for buf in owned} == listed


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16", "fp8"])
def test_mha_set_kv_buffer_converts_to_the_storage_dtype(
    dtype_name: str, device: torch.device
) -> None:
    pool = make_pool("mha", TorchRowMover(), dtype_name, device)
    assert isinstance(pool, MHAKVPool)
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(3, 2, 4, generator=gen).to(device)
    v = torch.randn(3, 2, 3, generator=gen).to(device)
    loc = slots([5, 1, 9], device)
    pool.set_kv_buffer(1, loc, k, v)
    stored_k = pool.get_key_buffer(1)[loc]
    assert stored_k.dtype == pool.store_dtype
    # Readers convert gathered rows to the compute dtype.
    dtype = pool.geometry.dtype
    torch.testing.assert_close(stored_k.to(dtype), k.to(pool.store_dtype).to(dtype), rtol=0, atol=0)
    assert torch.equal(raw(pool.get_value_buffer(1)[loc]), raw(v.to(pool.store_dtype)))


def test_mla_writes_latent_and_rope_into_one_row(device: torch.device) -> None:
    pool = make_pool("mla", TorchRowMover(), "bf16", device)
    assert isinstance(pool, MLAKVPool)
    gen = torch.Generator().manual_seed(4)
    latent = torch.randn(2, 1, 8, generator=gen).to(device, torch.bfloat16)
    rope = torch.randn(2, 1, 4, generator=gen).to(device, torch.bfloat16)
    loc = slots([7, 3], device)
    pool.set_mla_kv_buffer(0, loc, latent, rope)
    assert torch.equal(pool.get_kv_buffer(0)[loc], torch.cat([latent, rope], dim=-1))
    pool.set_kv_buffer(1, loc, torch.cat([rope, latent], dim=-1))
    assert torch.equal(pool.get_kv_buffer(1)[loc], torch.cat([rope, latent], dim=-1))


def test_dsa_indexer_keys_and_scales_move_in_lockstep_with_the_latent(
    device: torch.device,
) -> None:
    pool = make_pool("dsa", TorchRowMover(), "bf16", device)
    assert isinstance(pool, DSAKVPool)
    gen = torch.Generator().manual_seed(6)
    keys = torch.randn(3, 16, generator=gen).to(device).to(FP8)
    scales = torch.rand(3, generator=gen).to(device)
    pool.set_index_k(0, slots([4, 5, 6], device), keys, scales)
    pool.move_kv_cache(slots([1, 2, 3], device), slots([6, 4, 5], device))
    moved = slots([2, 3, 1], device)  # where slots 4, 5, 6 went
    assert torch.equal(raw(pool.get_index_k_buffer(0)[moved]), raw(keys))
    assert torch.equal(pool.get_index_scale_buffer(0)[moved], scales)
    with pytest.raises(TypeError, match="float8"):
        pool.set_index_k(0, slots([1], device), keys.float()[:1], scales[:1])
