"""Calibration of admission's predictions, with plain values."""

import pytest

from router.policies.calibration import Calibration, CalibrationConfig

SLO_S = 1.0


def test_neutral_until_enough_relevant_observations():
    calibration = Calibration(CalibrationConfig(min_observations=4))
    for _ in range(3):
        assert calibration.observe(0.5, 1.0, SLO_S)
    assert calibration.factor() == 1.0
    assert calibration.observe(0.5, 1.0, SLO_S)
    assert calibration.factor() == 2.0


def test_observations_far_below_the_slo_are_not_kept():
    calibration = Calibration(CalibrationConfig(min_observations=1, relevant_share=0.25))
    assert not calibration.observe(0.02, 0.04, SLO_S)       # both under a quarter of the SLO
    assert calibration.observe(0.1, 0.3, SLO_S)             # the observation is relevant: 3x low
    assert calibration.observe(0.6, 0.2, SLO_S)             # the prediction is: 3x high
    assert len(calibration) == 2


@pytest.mark.parametrize("values", [(0.0, 1.0), (1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf"))])
def test_meaningless_observations_are_ignored(values):
    assert not Calibration().observe(*values, SLO_S)


def test_factor_is_the_quantile_of_the_ratios():
    calibration = Calibration(CalibrationConfig(quantile=0.9, window=10, min_observations=10))
    for ratio in (0.8, 0.9, 1.0, 1.0, 1.1, 1.1, 1.2, 1.3, 1.5, 3.0):
        calibration.observe(1.0, ratio, SLO_S)
    assert calibration.factor() == 1.5          # the 9th of 10 (nearest rank)


def test_the_window_forgets_old_ratios():
    calibration = Calibration(CalibrationConfig(window=4, min_observations=4))
    for _ in range(4):
        calibration.observe(1.0, 3.0, SLO_S)
    for _ in range(4):
        calibration.observe(1.0, 1.1, SLO_S)
    assert calibration.factor() == pytest.approx(1.1)


@pytest.mark.parametrize("ratio, factor", [(100.0, 4.0), (0.01, 0.25)])
def test_factor_is_bounded(ratio, factor):
    calibration = Calibration(CalibrationConfig(min_observations=1, max_factor=4.0))
    calibration.observe(1.0, ratio, SLO_S)
    assert calibration.factor() == factor


@pytest.mark.parametrize("kwargs", [dict(quantile=1.0), dict(quantile=0.0), dict(window=0),
                                    dict(min_observations=100), dict(relevant_share=1.0), dict(max_factor=0.5)])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        CalibrationConfig(**kwargs)
