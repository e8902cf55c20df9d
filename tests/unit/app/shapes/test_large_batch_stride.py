"""A large batch's pricing and recording spread over several steps: the same paths recorded a
step, a record standing for the steps it covers, a probe recorded at once; a small batch's
record standing for its share of a step."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import pytest

from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.host_cadence import MAX_STRIDE, HostCadence
from eagletree.app.workers.shapes.learned_costs import LearnedCosts
from eagletree.domain.acceptance_profile import AcceptanceProfile
from eagletree.domain.draft_shape import PLAIN, DraftShape

from .policy_fixtures import ACCEPTING, CHAIN, COSTS, PESSIMISTIC, REJECTING, SHAPES, requests_at


def _pricings(
    batch_size: int, steps: int, monkeypatch: pytest.MonkeyPatch, rows_per_stride: int = 16
) -> int:
    """How many times a policy prices a batch of ``batch_size`` over ``steps`` steps (a
    pricing reads every candidate's cost once)."""
    reads: list[DraftShape] = []
    of = LearnedCosts.of

    def counted(self: LearnedCosts, shape: DraftShape, batch_size: int, sampled: bool) -> float:
        reads.append(shape)
        return of(self, shape, batch_size, sampled)

    monkeypatch.setattr(LearnedCosts, "of", counted)
    policy = AdaptiveShapes(
        SHAPES, drift=float("inf"), probe_every=10**6, rows_per_stride=rows_per_stride
    )
    policy.use_costs(COSTS)
    batch = requests_at([0.0] * batch_size)
    for _ in range(steps):
        policy.choose(batch)
    monkeypatch.undo()
    return len(reads) // len(SHAPES)


@pytest.mark.parametrize(("batch_size", "every"), [(1, 4), (8, 4), (16, 4), (32, 8), (64, 16)])
def test_a_pricing_stands_for_more_steps_the_larger_the_batch(
    batch_size: int, every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # reprice_every 4 steps, times one per 16 requests of the batch
    assert _pricings(batch_size, 64, monkeypatch) == 64 // every


def test_the_stride_stops_at_its_most(monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 requests at 2 a stride would price once in 128 steps; the stride stops at MAX_STRIDE
    assert _pricings(64, 128, monkeypatch, rows_per_stride=2) == 128 // (4 * MAX_STRIDE)


def _records(
    batch_size: int, steps: int, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int, float]]:
    """(paths, steps) of each record a policy makes over ``steps`` drafting steps of a batch of
    ``batch_size`` that accepts every draft."""
    import eagletree.app.workers.shapes.band_acceptance as module

    recorded: list[tuple[int, float]] = []

    class Counting(AcceptanceProfile):
        def record(
            self, paths: Sequence[tuple[Sequence[int], Sequence[int]]], *, steps: float = 1.0
        ) -> int:
            if steps:  # not the starting requests' part of the same step
                recorded.append((len(paths), steps))
            return super().record(paths, steps=steps)

    monkeypatch.setattr(module, "AcceptanceProfile", Counting)
    policy = AdaptiveShapes(SHAPES, observe_per_step=4, probe_every=10**6)
    policy.use_costs(COSTS)
    batch = requests_at([0.0] * batch_size)
    for _ in range(steps):
        policy.choose(batch)
        policy.observe(CHAIN, batch, ACCEPTING * batch_size)
    return recorded


@pytest.mark.parametrize(
    ("batch_size", "records"),
    [
        (1, [(1, 0.25)] * 8),
        (2, [(2, 0.5)] * 8),
        (8, [(4, 1)] * 8),
        (32, [(8, 2)] * 4),
        (64, [(16, 4)] * 2),
    ],
)
def test_a_large_batch_is_recorded_one_step_in_several_with_as_many_more_paths(
    batch_size: int, records: list[tuple[int, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 paths a step where the batch has them, whatever its size: 8 steps of a batch of 64 are
    # two records of 16 paths, each standing for 4 steps (the counts decay by all of them); a
    # batch of fewer than 4 is recorded every step, each its share of a step of 4 paths
    assert _records(batch_size, 8, monkeypatch) == records


def test_a_small_batch_forgets_by_the_paths_it_reads_as_a_large_one_does() -> None:
    # 256 paths that accept every draft, then 256 that accept none: 1 a step at bs 1, 4 at bs 4.
    # The profile after them is the same: a lone request's estimate averages as many paths
    # as a batch's (by steps, bs 1 would keep 6 % of the accepting paths' weight, bs 4 33 %)
    rates = []
    for batch_size in (1, 4):
        policy = AdaptiveShapes(SHAPES, observe_per_step=4, probe_every=10**6, drift=float("inf"))
        policy.use_costs(COSTS)
        batch = requests_at([0.0] * batch_size)
        for paths in (ACCEPTING, REJECTING):
            for _ in range(256 // batch_size):
                policy.choose(batch)
                policy.observe(CHAIN, batch, paths * batch_size)
        rates.append(policy.profile("greedy").chain_rate(0))
    assert 0.3 < rates[1] < 0.37  # a half-life of 64 steps of 4 paths: a third still accepting
    assert rates[0] == pytest.approx(rates[1], rel=0.02)


def test_a_probe_of_a_large_batch_is_recorded_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import eagletree.app.workers.shapes.band_acceptance as module

    recorded: list[tuple[int, float]] = []

    class Counting(AcceptanceProfile):
        def record(
            self, paths: Sequence[tuple[Sequence[int], Sequence[int]]], *, steps: float = 1.0
        ) -> int:
            recorded.append((len(paths), steps))
            return super().record(paths, steps=steps)

    monkeypatch.setattr(module, "AcceptanceProfile", Counting)
    # a pessimistic prior chooses plain; every plain step is due a probe
    policy = AdaptiveShapes(SHAPES, prior=PESSIMISTIC, probe_every=1, observe_per_step=4)
    policy.use_costs(COSTS)
    batch = requests_at([0.0] * 64)
    assert policy.choose(batch) == CHAIN  # the probe
    policy.observe(CHAIN, batch, ACCEPTING * 64)
    # its paths decide the next step: recorded with the probe's step, not held for 4
    assert recorded == [(4, 1)]
    assert policy.choose(batch) == CHAIN  # every draft accepted: the chain pays
    assert policy.choose(batch) != PLAIN


@pytest.mark.parametrize("batch_size", [1, 3, 8, 33, 64])
@pytest.mark.parametrize("observe_per_step", [1, 4, 5])
def test_a_records_sample_rotates_through_the_batch(batch_size: int, observe_per_step: int) -> None:
    cadence = HostCadence(observe_per_step=observe_per_step, rows_per_stride=16)
    sampled: list[int] = []
    for step in range(40):
        sample = cadence.sample(batch_size, now=step % 7 == 0)  # probes recorded at once too
        if sample is not None:
            indices, _ = sample
            assert len(set(indices)) == len(indices) <= batch_size
            sampled += indices
    # row after row, wrapping at the batch's end: every request sampled in its turn
    assert sampled[0] == 0
    assert all(later == (earlier + 1) % batch_size for earlier, later in pairwise(sampled))
