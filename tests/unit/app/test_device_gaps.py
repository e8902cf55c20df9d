"""Where a profiled step left the device idle: short gaps between kernels, long host waits."""

from __future__ import annotations

import random

import pytest

from eagletree.app.bench.device_gaps import SHORT_GAP_US, device_gaps


def _timeline(gaps_us: list[float], durations_us: list[float]) -> list[tuple[float, float, str]]:
    """Activities laid end to end with the given gaps before each one after the first."""
    spans, t = [], 0.0
    for i, duration in enumerate(durations_us):
        if i:
            t += gaps_us[i - 1]
        spans.append((t, t + duration, f"k{i}"))
        t += duration
    return spans


@pytest.mark.parametrize("seed", range(5))
def test_random_gaps_split_at_the_threshold_and_average_over_steps(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randint(2, 200)
    durations = [rng.uniform(0.5, 50.0) for _ in range(count)]
    gaps = [rng.choice([0.0, rng.uniform(0.1, SHORT_GAP_US), rng.uniform(6.0, 500.0)])
            for _ in range(count - 1)]  # fmt: skip
    spans = _timeline(gaps, durations)
    rng.shuffle(spans)  # the profiler's order is not time order
    steps = rng.randint(1, 4)
    result = device_gaps(spans, steps)
    short = [g for g in gaps if 0 < g <= SHORT_GAP_US]
    long = [g for g in gaps if g > SHORT_GAP_US]
    assert result.between_kernels_ms == pytest.approx(sum(short) / 1000 / steps)
    assert result.between_kernels == pytest.approx(len(short) / steps)
    assert result.host_wait_ms == pytest.approx(sum(long) / 1000 / steps)
    assert result.host_waits == pytest.approx(len(long) / steps)
    assert result.idle_ms == pytest.approx((sum(short) + sum(long)) / 1000 / steps)
    if long:  # the longest wait is charged to the activity that ended before it
        before = max(range(count - 1), key=lambda i: gaps[i])
        name, waited_ms = result.waits_after[0]
        assert name == f"k{before}" and waited_ms == pytest.approx(gaps[before] / 1000 / steps)


def test_overlapping_activities_are_one_busy_span_and_the_later_end_opens_the_gap() -> None:
    spans = [
        (0.0, 100.0, "long kernel"),
        (10.0, 20.0, "copy on another stream"),  # inside the long kernel: no gap
        (150.0, 160.0, "next"),
    ]
    result = device_gaps(spans, 1)
    assert result.between_kernels == 0
    assert result.host_waits == 1 and result.host_wait_ms == pytest.approx(0.05)
    ((name, waited_ms),) = result.waits_after
    assert name == "long kernel" and waited_ms == pytest.approx(0.05)


def test_no_activity_means_no_gaps_and_zero_steps_is_refused() -> None:
    assert device_gaps([], 2).idle_ms == 0
    with pytest.raises(ValueError, match="num_steps=0"):
        device_gaps([(0.0, 1.0, "k")], 0)
