"""Calibration of admission's predictions, with plain values."""

import pytest

from router.policies.calibration import Calibration, CalibrationConfig, pooled_quantile

SLO_S = 1.0


def test_one_slow_request_moves_nothing_two_move_the_factor_to_the_smaller_ratio():
    calibration = Calibration()                  # the defaults: 4 pseudo-observations at 1, the 0.75 quantile
    assert calibration.factor() == 1.0           # no evidence: the cost model as it is
    assert calibration.observe(0.5, 1.25, SLO_S)
    assert calibration.factor() == 1.0           # an outlier alone: 5 values, the 4th is the prior
    assert calibration.observe(0.5, 1.0, SLO_S)
    assert calibration.factor() == 2.0           # 6 values, the 5th: the smaller of the two ratios


@pytest.mark.parametrize("kept, factor", [
    (2, 1.01),     # [1]*4 + 1.01, 1.02: the 5th of 6, the smaller observed
    (4, 1.02),     # 8 values, the 6th: the 2nd of 4
    (16, 1.11),    # 20 values, the 15th: the 11th of 16, their two-thirds point
    (64, 1.47),    # 68 values, the 51st: the 47th of 64, near their 0.75 quantile (the 48th)
])
def test_the_factor_leaves_the_prior_as_evidence_comes_in(kept, factor):
    ratios = [1 + (i + 1) / 100 for i in range(kept)]   # the model 1-64% optimistic
    assert pooled_quantile(ratios, prior=1.0, prior_weight=4, quantile=0.75, bound=4.0) == pytest.approx(factor)


def test_the_pooled_quantile_counts_the_prior_as_copies_would():
    import math
    import random

    draw = random.Random(7)
    for _ in range(2000):
        ratios = [round(draw.uniform(0.2, 3.0), 1) for _ in range(draw.randrange(0, 30))]
        prior, weight = draw.choice([0.5, 1.0, 1.3, 2.0]), draw.randrange(0, 10)
        quantile = draw.choice([0.5, 0.56, 0.75, 0.9])
        pool = sorted(ratios + [prior] * weight)
        copies = pool[max(0, math.ceil(round(quantile * len(pool), 9)) - 1)] if pool else prior
        assert pooled_quantile(ratios, prior, weight, quantile, 4.0) == copies, (ratios, prior, weight, quantile)


def test_a_pessimistic_model_is_trusted_only_once_the_evidence_outweighs_the_prior():
    calibration = Calibration()
    for _ in range(2):
        calibration.observe(0.5, 0.25, SLO_S)    # seen at half the prediction
    assert calibration.factor() == 1.0           # [0.5, 0.5, 1, 1, 1, 1]: the 5th is the prior
    for _ in range(10):
        calibration.observe(0.5, 0.25, SLO_S)
    assert calibration.factor() == 0.5           # 12 of 16 values at 0.5: the 12th is one


def test_without_a_prior_the_minimum_is_a_hard_threshold():
    """The rule before the prior (a hard minimum, 16 then, and no pseudo-observations), kept as a setting."""
    calibration = Calibration(CalibrationConfig(min_observations=4, prior_weight=0))
    for _ in range(3):
        assert calibration.observe(0.5, 1.0, SLO_S)
    assert calibration.factor() == 1.0
    assert calibration.observe(0.5, 1.0, SLO_S)
    assert calibration.factor() == 2.0


def test_a_prior_other_than_one_is_where_it_starts_and_where_it_lapses_back():
    calibration = Calibration(CalibrationConfig(prior_factor=1.3))
    assert calibration.factor(now_s=0.0) == 1.3
    for _ in range(8):
        calibration.observe(1.0, 1.1, SLO_S, now_s=0.0)
    assert calibration.factor(now_s=1.0) == 1.3                 # 12 values, the 9th: still the prior
    for _ in range(4):
        calibration.observe(1.0, 1.1, SLO_S, now_s=0.0)
    assert calibration.factor(now_s=1.0) == pytest.approx(1.1)  # 16 values, the 12th: the evidence
    assert calibration.factor(now_s=61.0) == 1.3                # all aged out


def test_only_predictions_near_enough_the_slo_to_decide_are_kept():
    calibration = Calibration(CalibrationConfig(min_observations=1, relevant_share=0.25))
    assert not calibration.observe(0.02, 0.04, SLO_S)       # far under a quarter of the SLO
    assert not calibration.observe(0.2, 0.9, SLO_S)         # a cold engine's first request: not a model error
    assert calibration.observe(0.6, 0.2, SLO_S)             # 3x high, and near enough to decide
    assert calibration.observe(0.25, 0.5, SLO_S)            # 2x low, at the edge
    assert len(calibration) == 2


def test_old_observations_lapse_so_a_factor_that_refuses_everything_does_not_last():
    calibration = Calibration(CalibrationConfig(min_observations=2, max_age_s=60.0))
    calibration.observe(0.5, 2.0, SLO_S, now_s=0.0)
    calibration.observe(0.5, 2.0, SLO_S, now_s=10.0)
    assert calibration.factor(now_s=30.0) == 4.0
    assert calibration.factor(now_s=65.0) == 1.0            # one left: too few
    assert len(calibration) == 1


@pytest.mark.parametrize("values", [(0.0, 1.0), (1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf"))])
def test_meaningless_observations_are_ignored(values):
    assert not Calibration().observe(*values, SLO_S)


def test_factor_is_the_quantile_of_the_ratios():
    calibration = Calibration(CalibrationConfig(quantile=0.9, window=10, min_observations=10, prior_weight=0))
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
    calibration = Calibration(CalibrationConfig(min_observations=1, prior_weight=0, max_factor=4.0))
    calibration.observe(1.0, ratio, SLO_S)
    assert calibration.factor() == factor


@pytest.mark.parametrize("kwargs", [dict(quantile=1.0), dict(quantile=0.0), dict(window=0),
                                    dict(min_observations=100), dict(relevant_share=1.0), dict(max_factor=0.5),
                                    dict(max_age_s=0.0), dict(prior_weight=-1), dict(prior_weight=2.5),
                                    dict(prior_weight=65), dict(min_observations=True), dict(prior_factor=0.1),
                                    dict(prior_factor=float("nan"))])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        CalibrationConfig(**kwargs)


def test_the_wait_alone_is_learned_from_requests_that_waited():
    from router.policies.calibration import scaled_ttft_s, ttft_observation

    # predicted 1.0 s: 0.4 s own prefill + 0.6 s of wait; seen 1.3 s -> the wait took 0.9 s (1.5x)
    assert ttft_observation(1.0, 0.6, 1.3, "whole") == (1.0, 1.3)
    assert ttft_observation(1.0, 0.6, 1.3, "wait") == (0.6, pytest.approx(0.9))
    # faster than its own service predicted: the wait counts as a millisecond, a ratio near 0
    assert ttft_observation(1.0, 0.6, 0.3, "wait") == (0.6, 1e-3)
    # predicted not to wait: nothing to learn (observe ignores a zero prediction)
    predicted, observed = ttft_observation(0.9, 0.0, 1.0, "wait")
    assert not Calibration(CalibrationConfig(min_observations=1)).observe(predicted, observed, SLO_S)
    calibration = Calibration(CalibrationConfig(min_observations=1, prior_weight=0))
    assert calibration.observe(*ttft_observation(1.0, 0.6, 1.3, "wait"), SLO_S)
    assert calibration.factor() == pytest.approx(1.5)
    # judged: the own service as predicted, the wait scaled
    assert scaled_ttft_s(1.0, 0.6, 1.5, "whole") == pytest.approx(1.5)
    assert scaled_ttft_s(1.0, 0.6, 1.5, "wait") == pytest.approx(0.4 + 0.9)
    for bad in (lambda: ttft_observation(1.0, 0.6, 1.3, "queue"), lambda: scaled_ttft_s(1.0, 0.6, 1.5, "")):
        with pytest.raises(ValueError, match="the whole TTFT or its wait"):
            bad()
