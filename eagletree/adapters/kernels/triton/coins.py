"""Triton: per-request Philox4x32-10 sampling coins, one launch for a whole batch.

Computes ``domain.coins.uniform_coins`` bit for bit: coin i of request b is the first Philox
word of counter ``(offsets[b] + i, 0, 0, 0)`` under key ``(seed mod 2³², seed >> 32)``, turned
into ``(word >> 8) · 2⁻²⁴``. One program per request; no host sync, so it can be captured in a
CUDA graph with the seeds and offsets as static inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _uniform_coins_kernel(
    seeds_ptr,  # (bs,) int64
    offsets_ptr,  # (bs,) int64
    out_ptr,  # (bs, count) float32
    count,
    BLOCK: tl.constexpr,
    NUM_ROUNDS: tl.constexpr,
):
    req = tl.program_id(0)
    seed = tl.load(seeds_ptr + req).to(tl.uint64, bitcast=True)
    offset = tl.load(offsets_ptr + req)
    index = tl.arange(0, BLOCK)
    valid = index < count
    c0 = ((offset + index) & 0xFFFFFFFF).to(tl.uint32)
    c1 = tl.zeros([BLOCK], dtype=tl.uint32)
    c2 = tl.zeros([BLOCK], dtype=tl.uint32)
    c3 = tl.zeros([BLOCK], dtype=tl.uint32)
    k0 = tl.zeros([BLOCK], dtype=tl.uint32) + (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = tl.zeros([BLOCK], dtype=tl.uint32) + (seed >> 32).to(tl.uint32)
    round_a = tl.full([BLOCK], 0xD2511F53, dtype=tl.uint32)
    round_b = tl.full([BLOCK], 0xCD9E8D57, dtype=tl.uint32)
    for _ in tl.static_range(NUM_ROUNDS):
        prev_c0, prev_c2 = c0, c2
        c0 = tl.umulhi(round_b, prev_c2) ^ c1 ^ k0
        c2 = tl.umulhi(round_a, prev_c0) ^ c3 ^ k1
        c1 = round_b * prev_c2
        c3 = round_a * prev_c0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    coins = (c0 >> 8).to(tl.float32) * (1.0 / 16777216.0)
    tl.store(out_ptr + req * count + index, coins, mask=valid)


def uniform_coins(seeds: torch.Tensor, offsets: torch.Tensor, count: int) -> torch.Tensor:
    """(bs, count) float32 coins in [0, 1) of each request's Philox stream from its offset."""
    # seeds, offsets: (bs,) int64 on one device
    assert seeds.shape == offsets.shape and seeds.dim() == 1, (seeds.shape, offsets.shape)
    assert seeds.dtype == torch.int64 and offsets.dtype == torch.int64
    bs = seeds.shape[0]
    out = torch.empty(bs, count, dtype=torch.float32, device=seeds.device)
    if bs == 0 or count == 0:
        return out
    block = max(16, triton.next_power_of_2(count))
    _uniform_coins_kernel[(bs,)](
        seeds.contiguous(), offsets.contiguous(), out, count, BLOCK=block, NUM_ROUNDS=10
    )
    return out
