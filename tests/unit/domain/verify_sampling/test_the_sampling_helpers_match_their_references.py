"""The sampling helpers: ``probs_from_logits`` applies temperature, then top-k, then
top-p as the reference does, neutral filters keep the softmax bit for bit, and
``sample_from_probs`` is the inverse CDF."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.app.workers.step_kernels import TemperedProbs
from eagletree.domain.sampling import probs_from_logits, sample_from_probs, tempered_probs
from tests.conftest import requires_triton
from tests.hypothesis_profiles import examples

from ..brute_force.verification import inverse_cdf, probs_reference
from ..strategies import DEVICES
from .draws import edgy_coins


@settings(max_examples=examples(150), deadline=None)
@given(
    vocab=st.integers(2, 10),
    rows=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    use_top_k=st.booleans(),
    use_top_p=st.booleans(),
)
def test_probs_from_logits_applies_temperature_then_top_k_then_top_p(
    vocab: int, rows: int, seed: int, use_top_k: bool, use_top_p: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((rows, vocab), generator=gen) * 2
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.7])[torch.randint(4, (rows,), generator=gen)]
    top_k = torch.randint(0, vocab + 3, (rows,), generator=gen)
    top_p = torch.where(torch.rand(rows, generator=gen) < 0.3, 1.0, torch.rand(rows, generator=gen))
    probs = probs_from_logits(
        logits, temperature, top_k if use_top_k else None, top_p if use_top_p else None
    )
    assert probs.dtype == torch.float32 and probs.shape == (rows, vocab)
    for r in range(rows):
        expected = probs_reference(
            logits[r].tolist(),
            float(temperature[r]),
            int(top_k[r]) if use_top_k else 0,
            float(top_p[r]) if use_top_p else 1.0,
        )
        got = probs[r].tolist()
        assert [p > 0 for p in got] == [p > 0 for p in expected], (r, got, expected)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_top_p_is_measured_on_the_top_k_renormalised_distribution() -> None:
    # softmax = [0.4, 0.3, 0.2, 0.1]; top-k 2 leaves [4/7, 3/7]; top-p 0.5 then keeps token 0
    # alone (4/7 >= 0.5), as top_k_renorm → top_p_renorm does in SGLang
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    probs = probs_from_logits(logits, torch.ones(1), torch.tensor([2]), torch.tensor([0.5]))
    expected = probs_reference(logits[0].tolist(), 1.0, 2, 0.5)
    assert expected == [1.0, 0.0, 0.0, 0.0]
    assert probs[0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize("device", DEVICES)
def test_neutral_filters_keep_every_token_and_leave_the_softmax_bit_for_bit(device: str) -> None:
    # three equal heads and a tail: the float32 running sum of the sorted probabilities reaches
    # 1.0 before the tail, which "mass before < top_p" alone would drop at top_p = 1
    spread = torch.cat([torch.full((3,), 15.0), torch.linspace(5.0, -15.0, 37)])
    logits = spread.expand(4, 40).to(device)
    temperature = torch.full((4,), 0.8, device=device)
    # divided by the temperature tensor as the helper does: CUDA divides by a Python scalar as a
    # multiplication by its reciprocal, which differs in the last bit
    softmax = torch.softmax(logits / temperature.unsqueeze(1), dim=1)
    assert torch.allclose(softmax, torch.softmax(logits / 0.8, dim=1), rtol=1e-5, atol=0.0)
    neutral_k = torch.tensor([0, 40, 41, 0], device=device)  # 0 and >= V keep all
    neutral_p = torch.tensor([1.0, 1.0, 1.5, 1.0], device=device)
    for top_k, top_p in [(neutral_k, None), (None, neutral_p), (neutral_k, neutral_p)]:
        probs = probs_from_logits(logits, temperature, top_k, top_p)
        assert torch.equal(probs, softmax)
        assert bool((probs > 0).all())


@settings(max_examples=examples(150), deadline=None)
@given(vocab=st.integers(1, 9), rows=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_sample_from_probs_is_the_inverse_cdf_and_never_returns_a_zero_probability_token(
    vocab: int, rows: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    # unnormalised dyadic weights with zeros (also leading and trailing), sometimes all zero
    weights = (torch.randint(0, 5, (rows, vocab), generator=gen) ** 2).float() / 8
    weights[torch.rand(rows, generator=gen) < 0.1] = 0.0
    coins = edgy_coins((rows,), gen)
    tokens = sample_from_probs(weights, coins)
    expected = [inverse_cdf(w, c) for w, c in zip(weights.tolist(), coins.tolist(), strict=True)]
    assert tokens.tolist() == expected
    for row, token in zip(weights.tolist(), tokens.tolist(), strict=True):
        assert row[token] > 0 or not any(row)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "vocab", "block_v"), [(torch.float32, 50, 16),
                                                         (torch.bfloat16, 37, 64)])  # fmt: skip
def test_the_triton_tempered_softmax_equals_the_reference(
    device: str, dtype: torch.dtype, vocab: int, block_v: int
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.tempered_probs import tempered_probs as triton_probs

    gen = torch.Generator().manual_seed(vocab)
    rows = 12  # the interpreter runs a program per row
    logits = (3 * torch.randn((rows, vocab), generator=gen)).to(dtype)
    logits[0, 5] = logits[0, 30 % vocab] = logits[0].max() + 1  # a tie: the first column wins
    logits[1, : vocab // 2] = float("-inf")  # outside a draft vocabulary: whole blocks at 16
    logits[2, ::3] = float("-inf")
    logits[3, 7] = logits[3, 9] = logits[3].max() + 1  # a greedy row's tie
    temperature = torch.tensor([0.0, 0.5, 1.0, 0.0, 1.7, 0.7] * 2)
    expected = tempered_probs(logits, temperature)
    got = triton_probs(logits.to(device), temperature.to(device), block_v=block_v).cpu()
    greedy = temperature <= 0
    assert torch.equal(got[greedy], expected[greedy])  # one-hot on the first maximum
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)
    assert torch.equal(got > 0, expected > 0)  # -inf columns stay impossible
    # logits whose columns are not adjacent (a transposed buffer) are read from a copy
    transposed = logits.to(device).t().contiguous().t()
    assert transposed.stride(1) != 1
    again = triton_probs(transposed, temperature.to(device), block_v=block_v).cpu()
    assert torch.equal(again, got)
    assert torch.allclose(got.sum(dim=1), torch.ones(rows), atol=1e-5)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("device", DEVICES)
def test_the_tempered_softmax_writes_into_one_depth_of_a_larger_buffer(
    impl: str, device: str
) -> None:
    """A drawn chain's depths go straight into one (bs, S, V) block: each call fills its
    depth's rows, a strided view, and leaves the other depths' bytes as they were."""
    probs_of: TemperedProbs = tempered_probs
    if impl == "triton":
        requires_triton(device)
        from eagletree.adapters.kernels.triton import tempered_probs as kernel

        probs_of = kernel.tempered_probs
    gen = torch.Generator().manual_seed(3)
    bs, depths, vocab = 5, 3, 40
    logits = (3 * torch.randn((depths, bs, vocab), generator=gen)).to(device)
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.3, 0.0], device=device)
    block = torch.full((bs, depths, vocab), -7.0, device=device)
    for depth in (2, 0):  # depth 1 stays unwritten
        got = probs_of(logits[depth], temperature, out=block[:, depth])
        assert got.data_ptr() == block[:, depth].data_ptr()
    for depth in (0, 2):
        expected = tempered_probs(logits[depth].cpu(), temperature.cpu())
        assert torch.allclose(block[:, depth].cpu(), expected, rtol=1e-5, atol=1e-7)
    assert bool((block[:, 1] == -7.0).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("vocab", "block_v"), [(50, 16), (37, 64), (9, 16)])
def test_the_triton_sample_equals_the_reference(device: str, vocab: int, block_v: int) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.draw_children import (
        sample_from_probs as triton_sample,
    )

    gen = torch.Generator().manual_seed(vocab)
    rows = 20  # the interpreter runs a program per row
    # unnormalised dyadic weights (every partial sum exact: the two scans' orders agree), with
    # zeros inside, at the edges and across whole blocks; a one-hot row, an all-zero row
    weights = (torch.randint(0, 5, (rows, vocab), generator=gen) ** 2).float() / 8
    weights[1, block_v : 2 * block_v] = 0.0
    weights[2] = 0.0
    weights[2, vocab - 1] = 3.0
    weights[3] = 0.0
    weights[4, :3] = weights[4, -3:] = 0.0
    coins = edgy_coins((rows,), gen)
    expected = sample_from_probs(weights, coins)
    got = triton_sample(weights.to(device), coins.to(device), block_v=block_v).cpu()
    assert got.dtype == torch.int64 and got.shape == (rows,)
    assert torch.equal(got, expected)
    assert got[2] == vocab - 1 and got[3] == 0
