"""Tests of per-request sampling: a request's distribution and tokens do not depend on its batch.

The sampler fills neutral values (top_k 0, top_p 1.0) for requests that set no filter, and
every sampling row goes through the filters; a request alone and beside neighbours with other
filters and temperatures must get the very same distribution, and with the same seed the
same tokens.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagletree.app.workers.sampler import (
    SamplingMode,
    sample_next_tokens,
    sampling_inputs,
    sampling_rows,
)
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams
from tests.chi_square import chi_square_p_value

VOCAB = 40
CPU = torch.device("cpu")
NUM_DRAWS = 4000
# the request under test: no filter, each filter, the filters at their neutral values, greedy
TARGETS = {
    "no filter": SamplingParams(max_new_tokens=1, temperature=0.8),
    "top-p 1": SamplingParams(max_new_tokens=1, temperature=0.8, top_p=1.0),
    "top-k = vocab": SamplingParams(max_new_tokens=1, temperature=1.2, top_k=VOCAB),
    "top-k": SamplingParams(max_new_tokens=1, temperature=0.7, top_k=5),
    "top-p": SamplingParams(max_new_tokens=1, temperature=1.3, top_p=0.9),
    "greedy": SamplingParams(max_new_tokens=1),
}
NEIGHBOURS = [
    SamplingParams(max_new_tokens=1, temperature=1.5, top_k=3),
    SamplingParams(max_new_tokens=1, temperature=0.5, top_p=0.6),
    SamplingParams(max_new_tokens=1),
    SamplingParams(max_new_tokens=1, temperature=2.0, top_k=7, top_p=0.3),
]


def long_tailed_logits(rows: int) -> torch.Tensor:
    """(rows, VOCAB) logits, row r rolled by 7·r: three equally likely tokens, then a tail
    spread over 20 nats. On the CPU the float32 cumulative sum of row 0's sorted probabilities
    reaches 1.0 before the tail at the temperatures used here (0.8, 1.2), so a "mass so far <
    top_p" test at top_p = 1 would drop the tail (the test checks that the sum does reach 1.0)."""
    spread = torch.cat([torch.full((3,), 15.0), torch.linspace(5.0, -15.0, VOCAB - 3)])
    return torch.stack([spread.roll(7 * r) for r in range(rows)])


def requests_of(params: list[SamplingParams], seeds: list[int]) -> list[Request]:
    return [
        Request(i, [1], dataclasses.replace(p, seed=seed), max_context_len=8)
        for i, (p, seed) in enumerate(zip(params, seeds, strict=True))
    ]


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_requests_distribution_is_the_same_alone_and_beside_other_filters(
    name: str, device: torch.device
) -> None:
    target = TARGETS[name]
    logits = long_tailed_logits(1 + len(NEIGHBOURS)).to(device)
    alone = sampling_inputs(requests_of([target], [0]), 0, device).probs(logits[:1])
    # the target sits in the middle of its neighbours, which set other filters and temperatures
    params = [*NEIGHBOURS[:2], target, *NEIGHBOURS[2:]]
    order = [1, 2, 0, 3, 4]  # logits row of each batch position: the target keeps row 0
    batch = sampling_inputs(requests_of(params, list(range(5))), 0, device)
    assert batch.top_k[2] == 0 or target.top_k is not None  # neutral values were filled in
    beside = batch.probs(logits[order])
    assert torch.equal(beside[2], alone[0])  # bit for bit, the tail included
    unfiltered = (target.top_k is None or target.top_k >= VOCAB) and (
        target.top_p is None or target.top_p >= 1
    )
    if unfiltered and not target.greedy:  # the neutral filters keep every token, exactly
        softmax = torch.softmax(logits[0] / target.temperature, dim=0)
        if device.type == "cpu":
            assert torch.equal(alone[0], softmax)
        else:  # CUDA divides by a scalar as a product with its reciprocal: a one-ulp
            # difference in a logit of ~25 moves exp by ~25 ulps (2e-6 measured on the H200);
            # a dropped or truncated tail token would differ by 100 %
            torch.testing.assert_close(alone[0], softmax, rtol=1e-5, atol=0.0)
        assert bool((alone[0] > 0).all())  # the tail (p down to ~1e-9) is kept
        ranked = torch.sort(softmax, descending=True).values
        mass_before = torch.cumsum(ranked, dim=0) - ranked
        if device.type == "cpu":  # the hazard is there ("1.0" before the tail), on this device
            assert float(mass_before[-1]) >= 1.0


@pytest.mark.parametrize("name", list(TARGETS))
def test_sampled_tokens_do_not_depend_on_the_neighbours_and_follow_the_distribution(
    name: str, device: torch.device
) -> None:
    target = TARGETS[name]
    logits = long_tailed_logits(1).to(device)  # (1, V)
    seeds = list(range(NUM_DRAWS))
    # NUM_DRAWS copies of the target (seed i each), alone and each beside all the neighbours
    alone = sample_next_tokens(
        logits.expand(NUM_DRAWS, VOCAB), requests_of([target] * NUM_DRAWS, seeds), REFERENCE_KERNELS
    )
    width = 1 + len(NEIGHBOURS)
    mixed = [p for _ in seeds for p in (target, *NEIGHBOURS)]
    mixed_seeds = [s if j == 0 else 10**6 + s * width + j for s in seeds for j in range(width)]
    other_logits = long_tailed_logits(width).to(device)
    mixed_logits = torch.cat([logits, other_logits[1:]]).repeat(NUM_DRAWS, 1)  # (width·D, V)
    beside = sample_next_tokens(mixed_logits, requests_of(mixed, mixed_seeds), REFERENCE_KERNELS)
    beside = beside[::width]
    # same seed, same distribution: the same coins give the same tokens
    assert torch.equal(beside.cpu(), alone.cpu())
    expected = sampling_inputs(requests_of([target], [0]), 0, device).probs(logits)[0]
    observed = torch.bincount(beside.cpu(), minlength=VOCAB).double()
    assert observed[expected.cpu() == 0].sum() == 0  # no token outside the filters
    if target.greedy:
        assert set(beside.tolist()) == {int(logits[0].argmax())}
    else:
        assert chi_square_p_value(observed, NUM_DRAWS * expected.double().cpu()) > 1e-3


def test_a_batch_without_top_k_or_top_p_skips_the_sort_and_gets_the_same_distributions() -> None:
    def mode_of(params: list[SamplingParams]) -> SamplingMode:
        return sampling_inputs(requests_of(params, list(range(len(params)))), 1, CPU).mode

    greedy, plain = TARGETS["greedy"], TARGETS["no filter"]
    assert mode_of([greedy, greedy]) is SamplingMode.GREEDY
    assert mode_of([greedy, plain, TARGETS["top-p 1"]]) is SamplingMode.SAMPLED
    assert mode_of([plain, TARGETS["top-k"]]) is SamplingMode.FILTERED
    assert mode_of([plain, TARGETS["top-p"]]) is SamplingMode.FILTERED
    batch = requests_of([greedy, plain, TARGETS["top-p 1"]], [1, 2, 3])
    sampled = sampling_inputs(batch, 1, CPU)
    filtered = dataclasses.replace(sampled, mode=SamplingMode.FILTERED)
    logits = long_tailed_logits(3)
    # a distribution no filter cuts is its tempered softmax, sorted through or not
    assert torch.equal(sampled.probs(logits), filtered.probs(logits))
    # and a batch with a filter still cuts: top-k 5 keeps five tokens
    cut = sampling_inputs(requests_of([plain, TARGETS["top-k"]], [1, 2]), 1, CPU)
    assert cut.mode is SamplingMode.FILTERED
    assert [int((row > 0).sum()) for row in cut.probs(logits[:2])] == [VOCAB, 5]


def test_a_greedy_batch_reads_no_request_and_gets_the_same_tokens_as_the_walked_rows() -> None:
    # greedy requests with filters set: their values, walked, are not the neutral ones
    greedy = [dataclasses.replace(TARGETS["greedy"], top_k=3, top_p=0.5)] * 3
    requests = requests_of(greedy, [1, 2, 3])
    walked = sampling_rows(requests, 5)
    fast = sampling_rows(requests, 5, SamplingMode.GREEDY)
    assert fast == ([0] * 9, [0.0] * 3 + [1.0] * 3)
    assert walked != fast  # the fast path skipped the walk (the values it would have read)
    assert [r.coin_offset for r in requests] == [0, 0, 0]  # greedy requests take no coins
    logits = long_tailed_logits(3) + torch.randn(3, VOCAB)
    tokens = sample_next_tokens(logits, requests, REFERENCE_KERNELS)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_a_sampled_batch_walks_its_requests_whatever_mode_is_passed_for_it() -> None:
    requests = requests_of([TARGETS["top-k"], TARGETS["greedy"]], [1, 2])
    ints, floats = sampling_rows(requests, 4, SamplingMode.FILTERED)
    assert ints[:2] == [5, 0]  # top_k of each
    assert floats[:2] == [0.7, 0.0]  # temperatures
    assert requests[0].coin_offset == 4 and requests[1].coin_offset == 0
