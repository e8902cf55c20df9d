"""A shape's calibration: its steps' accepted drafts over what the model expects of them now,
held near 1 by a prior worth a few requests, decayed by the requests of the shape's own steps
(one below its model by the others' too), bounded."""

from __future__ import annotations

import pytest

from eagletree.domain.acceptance_calibration import AcceptanceCalibration


def test_a_shape_not_yet_run_keeps_its_model() -> None:
    calibration = AcceptanceCalibration(2)
    assert calibration.factor(0, 2.0) == 1.0 and calibration.factor(1, 2.0) == 1.0
    calibration.record(1, accepted=0.0, modelled=0.0, requests=4)  # plain: nothing to scale
    assert calibration.factor(1, 2.0) == 1.0
    assert calibration.factor(1, 0.0) == 1.0  # a model that expects nothing is not scaled


def test_the_factor_is_observed_over_what_the_model_expects_with_its_mean_as_prior() -> None:
    calibration = AcceptanceCalibration(2, prior_weight=4.0, half_life=1e9)
    # 4 requests accepted 12 drafts where the model expects 2 of each: 12 against 8, and a
    # prior of 4 requests at the model's 2 → (12 + 8) / (8 + 8)
    calibration.record(0, accepted=12.0, modelled=2.0, requests=4)
    assert calibration.factor(0, 2.0) == pytest.approx(1.25)
    assert calibration.factor(1, 2.0) == 1.0  # another shape's steps move only their own
    calibration.record(0, accepted=2.0, modelled=2.0, requests=4)
    # 14 drafts over 8 requests, and the prior: (14 + 4 · 2) / ((8 + 4) · 2)
    assert calibration.factor(0, 2.0) == pytest.approx(22.0 / 24.0)


def test_steps_are_measured_against_the_model_as_it_stands_not_as_it_stood() -> None:
    # the model expected 2 drafts a request while the profile was young; its steps accepted 1
    # each, and the profile, learning from the same steps, now expects 1: the steps agree with
    # the model, and no factor below 1 is left to count the profile's early error again
    calibration = AcceptanceCalibration(1, prior_weight=4.0, half_life=1e9)
    for _ in range(4):
        calibration.record(0, accepted=8.0, modelled=2.0, requests=8)
    assert calibration.factor(0, 2.0) == pytest.approx((32.0 + 8.0) / (36.0 * 2.0))
    assert calibration.factor(0, 1.0) == pytest.approx(1.0)
    assert calibration.factor(0, 0.5) == pytest.approx((32.0 + 2.0) / (36.0 * 0.5))


def test_older_steps_weigh_less_and_the_factor_stays_within_its_bounds() -> None:
    calibration = AcceptanceCalibration(1, prior_weight=1.0, half_life=1.0, low=0.5, high=2.0)
    calibration.record(0, accepted=4.0, modelled=1.0, requests=1)
    calibration.record(0, accepted=1.0, modelled=1.0, requests=1)
    # the first step weighs half: observed 2 + 1, requests 0.5 + 1; prior 1 at the model's 1
    assert calibration.factor(0, 1.0) == pytest.approx((3.0 + 1.0) / (1.5 + 1.0))
    for _ in range(8):
        calibration.record(0, accepted=40.0, modelled=1.0, requests=1)
    assert calibration.factor(0, 1.0) == 2.0
    for _ in range(16):
        calibration.record(0, accepted=0.0, modelled=1.0, requests=1)
    assert calibration.factor(0, 1.0) == 0.5


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="low <= 1 <= high"):
        AcceptanceCalibration(1, low=1.5)
    with pytest.raises(ValueError, match="positive"):
        AcceptanceCalibration(0)


def test_a_step_ages_the_older_sums_by_its_requests_not_by_one() -> None:
    # one step of 8 requests ages what came before as much as 8 steps of one request: a batch
    # of one measures its shapes over as many paths as a large batch does
    wide = AcceptanceCalibration(1, prior_weight=1.0, half_life=8.0)
    narrow = AcceptanceCalibration(1, prior_weight=1.0, half_life=8.0)
    for calibration in (wide, narrow):
        calibration.record(0, accepted=16.0, modelled=1.0, requests=8)
    wide.record(0, accepted=0.0, modelled=1.0, requests=8)
    for _ in range(8):
        narrow.record(0, accepted=0.0, modelled=1.0, requests=1)
    # in both the first step's 16 drafts over 8 requests weigh half: 8 drafts over 4, then
    # the new requests (the narrow ones aged by those after them) and the prior of 1
    assert wide.factor(0, 1.0) == pytest.approx((8.0 + 1.0) / (4.0 + 8.0 + 1.0))
    newer = sum(0.5 ** (k / 8.0) for k in range(8))
    assert narrow.factor(0, 1.0) == pytest.approx((8.0 + 1.0) / (4.0 + newer + 1.0))


def test_a_shape_priced_below_its_model_fades_back_as_others_run_and_one_above_does_not() -> None:
    calibration = AcceptanceCalibration(3, prior_weight=1.0, half_life=4.0)
    calibration.record(0, accepted=0.0, modelled=1.0, requests=4)  # unlucky: 0 against 4
    calibration.record(1, accepted=8.0, modelled=1.0, requests=4)  # lucky: 8 against 4
    low, high = calibration.factor(0, 1.0), calibration.factor(1, 1.0)
    assert low < 1.0 < high
    # shape 0 now runs no more; every step of shape 2 halves its sums (4 requests, its half-life),
    # so its prior weighs ever more: its factor returns towards 1; shape 1's stays
    for _ in range(8):
        calibration.record(2, accepted=4.0, modelled=1.0, requests=4)
    assert calibration.factor(0, 1.0) > 0.95 and calibration.factor(1, 1.0) == high


def test_below_its_model_is_judged_against_the_model_as_it_stands_when_read() -> None:
    calibration = AcceptanceCalibration(2, prior_weight=1.0, half_life=4.0)
    # shape 0's steps accepted what a young profile expected then (1 a request) ...
    calibration.record(0, accepted=4.0, modelled=1.0, requests=4)
    assert calibration.factor(0, 1.0) == pytest.approx(1.0)
    # ... and the profile, learning from other shapes' steps, now expects 2: below it
    before = calibration.factor(0, 2.0)
    assert before == pytest.approx((4.0 + 2.0) / (5.0 * 2.0))
    for _ in range(8):  # every step of shape 1 halves shape 0's sums (half-life 4 requests)
        calibration.record(1, accepted=8.0, modelled=2.0, requests=4)
    assert calibration.factor(0, 2.0) > 0.99  # back to the model it is read against
    assert calibration.factor(0, 1.0) == pytest.approx(1.0)  # where it agreed, unfaded
    # when it runs again, what faded stays faded: 0.5^8 of its first step is left
    calibration.record(0, accepted=8.0, modelled=2.0, requests=4)
    left = 0.5**8
    expected = (0.5 * 4.0 * left + 8.0 + 2.0) / ((0.5 * 4.0 * left + 4.0 + 1.0) * 2.0)
    assert calibration.factor(0, 2.0) == pytest.approx(expected)
