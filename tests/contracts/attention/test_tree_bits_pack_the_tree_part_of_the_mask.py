"""The packed tree bits the kernels read: the torch reference and the Triton packer
against the tree part of the mask, in both mask layouts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.adapters.attention.metadata import tree_tail_bits, tree_tail_mask
from eagletree.adapters.kernels.triton.tree_bits import pack_tree_bits
from eagletree.domain.batch import TargetVerifySpec
from eagletree.domain.tree import TreeMaskMode
from tests.conftest import requires_triton


def random_tree_spec(
    n: int, full: bool, seed: int, device: torch.device | str = "cpu"
) -> tuple[TargetVerifySpec, torch.Tensor]:
    """A spec over arbitrary random mask bits (packing needs no valid tree) and its seq_lens."""
    gen = torch.Generator().manual_seed(seed)
    bs = 3
    seq_lens = torch.randint(0, 9, (bs,), generator=gen)
    rows = n * (seq_lens + n) if full else torch.full((bs,), n * n)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(rows, 0)])
    flat = torch.rand(int(indptr[-1]), generator=gen) < 0.5
    mode = TreeMaskMode.FULL_MASK if full else TreeMaskMode.QLEN_ONLY
    spec = TargetVerifySpec(n, flat.to(device), mode, indptr.to(device))
    return spec, seq_lens.to(device)


@settings(max_examples=15, deadline=None)
@given(
    n=st.sampled_from([1, 5, 31, 32, 33, 64, 70]),
    full=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tree_bits_unpack_to_the_tree_part_of_the_mask(n: int, full: bool, seed: int) -> None:
    spec, seq_lens = random_tree_spec(n, full, seed)
    bs = seq_lens.shape[0]
    bits = tree_tail_bits(spec, seq_lens)
    assert bits.dtype == torch.int32 and bits.shape == (bs * n, (n + 31) // 32)
    column = torch.arange(32 * bits.shape[1])
    unpacked = (bits.to(torch.int64)[:, column // 32] >> (column % 32)) & 1  # (bs·N, 32·words)
    assert not unpacked[:, n:].any()  # bits past N stay clear
    expected = tree_tail_mask(spec, seq_lens).view(bs * n, n)
    torch.testing.assert_close(unpacked[:, :n].bool(), expected, rtol=0, atol=0)
    buffer = torch.full_like(bits, -7)  # a preallocated buffer keeps its address (CUDA graphs)
    written = tree_tail_bits(spec, seq_lens, out=buffer)
    assert written.data_ptr() == buffer.data_ptr() and torch.equal(buffer, bits)


@pytest.mark.parametrize("n", [1, 33, 70])
@pytest.mark.parametrize("full", [True, False], ids=["full", "qlen"])
def test_triton_packs_the_tree_bits_like_the_reference(
    n: int, full: bool, device: torch.device
) -> None:
    requires_triton(device)
    spec, seq_lens = random_tree_spec(n, full, seed=n, device=device)
    expected = tree_tail_bits(spec, seq_lens)
    out = torch.full_like(expected, -7)
    pack_tree_bits(spec.tree_mask, spec.mask_indptr, seq_lens, n, full, out)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
