"""Sampling coins: Philox4x32-10 against its published answers, streams per (seed, offset), the
Triton kernel bit for bit against the torch reference, and the coins' uniformity."""

from __future__ import annotations

import math

import pytest
import torch

from eagletree.domain.coins import philox4x32, uniform_coins
from tests.conftest import requires_triton

# Known-answer vectors of Random123's kat_vectors for philox4x32_10: (counter, key, output)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_philox_matches_the_published_known_answers(
    counter: tuple[int, ...], key: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    words = philox4x32(
        tuple(torch.tensor([c]) for c in counter),  # type: ignore[arg-type]
        tuple(torch.tensor([k]) for k in key),  # type: ignore[arg-type]
    )
    assert [int(w) for w in words] == list(expected)


def test_a_request_s_coins_depend_only_on_its_seed_and_offset() -> None:
    seeds = torch.tensor([7, -5, 7, 1 << 40])
    offsets = torch.tensor([0, 3, 4, 9])
    coins = uniform_coins(seeds, offsets, 6)
    assert coins.shape == (4, 6) and coins.dtype == torch.float32
    # the same stream, read from a later offset, continues where the first row stood
    assert torch.equal(coins[2, :2], coins[0, 4:6])
    alone = uniform_coins(seeds[1:2], offsets[1:2], 6)
    assert torch.equal(alone[0], coins[1])  # batch neighbours change nothing
    assert not torch.equal(coins[0], coins[3])  # another seed, another stream
    assert bool(((coins >= 0) & (coins < 1)).all())


def test_an_empty_batch_has_no_coins() -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    assert uniform_coins(empty, empty, 5).shape == (0, 5)


def test_coins_are_uniform_by_a_chi_square_test() -> None:
    seeds = torch.arange(64, dtype=torch.int64) * 1_000_003
    coins = uniform_coins(seeds, torch.zeros(64, dtype=torch.int64), 500).flatten()
    bins = 20
    counts = torch.bincount((coins * bins).long(), minlength=bins).double()
    expected = coins.numel() / bins
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 19 degrees of freedom: P(chi2 > 43.8) = 0.001
    assert chi2 < 43.8, chi2
    # neighbouring coins of one stream are uncorrelated
    pairs = coins.view(64, 500)
    corr = torch.corrcoef(torch.stack([pairs[:, :-1].flatten(), pairs[:, 1:].flatten()]))[0, 1]
    assert abs(float(corr)) < 4 / math.sqrt(pairs[:, 1:].numel())


@pytest.mark.parametrize("count", [1, 9, 65])
def test_the_triton_kernel_computes_the_reference_coins_bit_for_bit(
    device: torch.device, count: int
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.coins import uniform_coins as triton_coins

    generator = torch.Generator().manual_seed(count)
    seeds = torch.randint(-(1 << 62), 1 << 62, (5,), generator=generator, dtype=torch.int64)
    offsets = torch.tensor([0, 1, (1 << 32) - 3, 12345, 7], dtype=torch.int64)  # one wraps
    expected = uniform_coins(seeds, offsets, count)
    got = triton_coins(seeds.to(device), offsets.to(device), count)
    assert torch.equal(got.cpu(), expected)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    assert triton_coins(empty, empty, count).shape == (0, count)
