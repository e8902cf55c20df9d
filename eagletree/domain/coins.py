"""Reference semantics of sampling coins: counter-based Philox4x32-10, per request seed and offset.

A request's coins are a pure function of its seed and of a counter it advances by the coins it
has used, so they do not depend on which requests share its batch, on padding, or on whether a
step ran eagerly or from a captured CUDA graph. Coin ``i`` of a request is

    uniform(philox(counter = (offset + i, 0, 0, 0), key = (seed mod 2³², seed >> 32))[0])

where ``uniform(x) = (x >> 8) · 2⁻²⁴``: 24 random bits, exactly representable in float32, in
[0, 1). The torch code here works on uint32 values held in int64 tensors (torch has no uint32
arithmetic on every device) and is bit-for-bit the specification of the Triton kernel in
``adapters/kernels/triton/coins.py``.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
ROUND_A = 0xD2511F53
ROUND_B = 0xCD9E8D57
KEY_A = 0x9E3779B9
KEY_B = 0xBB67AE85
NUM_ROUNDS = 10


def _mul_hi_lo(a: torch.Tensor, constant: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a · constant`` for uint32 ``a`` in int64, without overflow."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    low_part = a_lo * constant  # < 2⁴⁸
    t = a_hi * constant + (low_part >> 16)  # < 2⁴⁹
    hi = t >> 16
    lo = ((t & 0xFFFF) << 16) | (low_part & 0xFFFF)
    return hi & MASK32, lo & MASK32


def philox4x32(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 (Salmon et al., SC'11) on uint32 words held in int64 tensors of one shape."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(NUM_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(c2, ROUND_B)
        hi_a, lo_a = _mul_hi_lo(c0, ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + KEY_A) & MASK32
        k1 = (k1 + KEY_B) & MASK32
    return c0, c1, c2, c3


def philox_words(counter: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """First output word of Philox4x32-10 for counters ``(counter, 0, 0, 0)`` → uint32 in int64.

    ``counter`` (..., n) int64 in [0, 2³²); ``seeds`` broadcastable to it, int64 (its two
    32-bit halves are the key).
    """
    c0 = counter & MASK32
    zero = torch.zeros_like(c0)
    key = ((seeds & MASK32).expand_as(c0), ((seeds >> 32) & MASK32).expand_as(c0))
    return philox4x32((c0, zero, zero, zero), key)[0]


def uniform_coins(seeds: torch.Tensor, offsets: torch.Tensor, count: int) -> torch.Tensor:
    """Coins ``offsets[b] .. offsets[b] + count − 1`` of request b → (bs, count) float32 in [0, 1).

    ``seeds`` (bs,) int64 (any value; two requests with one seed share a stream); ``offsets``
    (bs,) int64 ≥ 0, the coins each request used before. Device ops only, no host sync.
    """
    # seeds, offsets: (bs,) -> counters (bs, count)
    steps = torch.arange(count, dtype=torch.int64, device=offsets.device)
    counter = offsets.to(torch.int64).unsqueeze(1) + steps
    words = philox_words(counter, seeds.to(torch.int64).unsqueeze(1))
    return (words >> 8).to(torch.float32) * (1.0 / (1 << 24))
