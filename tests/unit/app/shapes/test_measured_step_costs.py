"""The start-up cost table: every runner timed at every bucket, greedy and sampled, the
catch-up apart, with a progress line after each runner (eager steps on the CPU take minutes
over the default set of shapes, and the user sees how far it got)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import pytest

from eagletree.app.workers.sampler import SamplingMode
from eagletree.app.workers.shapes.step_costs import measure_step_costs
from eagletree.domain.draft_shape import PLAIN, DraftShape

if TYPE_CHECKING:
    from eagletree.app.workers.step_graphs import DecodeStepRunner


class _Runner:
    """A runner whose step at ``bucket`` takes ``base`` + bucket ** ``power`` ms (+ 0.5
    sampled); ``num_graphs`` 0: its steps run eagerly."""

    def __init__(self, base: float, *, power: int = 1, num_graphs: int = 4) -> None:
        self.base, self.power, self.num_graphs = base, power, num_graphs
        self.calls: list[tuple[int, SamplingMode, int, bool]] = []

    def time_step(
        self, bucket: int, mode: SamplingMode, repeats: int, *, warm_up: bool = True
    ) -> float:
        self.calls.append((bucket, mode, repeats, warm_up))
        return (
            self.base + float(bucket) ** self.power + 0.5 * (mode is SamplingMode.SAMPLED)
        ) / 1e3


def _runner(base: float, **kwargs: int) -> Any:
    return cast("DecodeStepRunner", _Runner(base, **kwargs))


def test_every_runner_is_timed_at_every_bucket_and_reported_as_it_ends() -> None:
    chain, tree = DraftShape.chain(2), DraftShape(3, 2, 6)
    runners = {PLAIN: _runner(1.0), chain: _runner(2.0), tree: _runner(3.0)}
    catch_up = _runner(10.0)
    lines: list[str] = []
    costs = measure_step_costs(
        runners, (1, 8), catch_up=catch_up, catch_up_every=4, repeats=3, progress=lines.append
    )
    for base, shape in enumerate(runners, start=1):
        for bucket in (1, 8):
            assert costs.seconds[shape, bucket, False] == (base + bucket) / 1e3
            assert costs.seconds[shape, bucket, True] == (base + bucket + 0.5) / 1e3
    assert len(costs.seconds) == 3 * 2 * 2
    assert costs.catch_up == {(b, s): (10 + b + 0.5 * s) / 1e3 for b in (1, 8) for s in (0, 1)}
    assert costs.catch_up_every == 4 and costs.buckets == (1, 8)
    for runner in [*runners.values(), catch_up]:
        assert {(repeats, warm_up) for _, _, repeats, warm_up in runner.calls} == {(3, True)}
        assert len(runner.calls) == 4
    labels = [shape.label for shape in runners] + ["plain with the draft's catch-up"]
    assert lines[:-1] == [
        f"measuring the step costs: {i}/4 ({label})" for i, label in enumerate(labels, start=1)
    ]
    assert lines[-1].startswith("measured the step costs of 3 draft shapes at 2 batch sizes")


def test_without_a_catch_up_there_is_none_and_no_progress_is_asked_for() -> None:
    costs = measure_step_costs({PLAIN: _runner(1.0)}, (4,), repeats=1)
    assert costs.catch_up == {}
    assert costs.seconds == {(PLAIN, 4, False): 5 / 1e3, (PLAIN, 4, True): 5.5 / 1e3}


def test_an_eager_runner_is_timed_once_at_three_buckets_and_priced_on_lines_between_them() -> None:
    eager = _Runner(1.0, power=2, num_graphs=0)
    costs = measure_step_costs({PLAIN: cast("DecodeStepRunner", eager)}, (1, 2, 4, 8, 16))
    # once a bucket and sampling, warmed up at the first bucket only
    assert sorted((b, m.value, r, w) for b, m, r, w in eager.calls) == sorted(
        (bucket, mode.value, 1, bucket == 1)
        for bucket in (1, 4, 16)
        for mode in (SamplingMode.GREEDY, SamplingMode.SAMPLED)
    )
    greedy = {bucket: costs.seconds[PLAIN, bucket, False] * 1e3 for bucket in (1, 2, 4, 8, 16)}
    # timed: 1 + b²; between: 2 is a third of the way from 1 (2 ms) to 4 (17 ms), 8 a third
    # of the way from 4 to 16 (257 ms)
    assert greedy == pytest.approx({1: 2.0, 2: 7.0, 4: 17.0, 8: 97.0, 16: 257.0})
    assert costs.seconds[PLAIN, 8, True] * 1e3 == pytest.approx(97.5)
