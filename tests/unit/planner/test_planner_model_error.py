"""The online model-error tracker (planner/model_error.py) with plain values: relative errors, the
recent window, the correction converging on a constant bias, and the gate refusing and allowing.

The model's raw prediction is RAW below; the observations are RAW times a bias per metric."""

from __future__ import annotations

import json
import math

import pytest

from planner.decision import SloScale
from planner.model_error import ErrorConfig, Latencies, ModelErrorTracker, Verdict, may_act

RAW = Latencies(ttft_p50_s=0.5, ttft_p90_s=1.0, tpot_p50_s=0.05, tpot_p90_s=0.1)
NO_CORRECTION = {"min_factor": 1.0, "max_factor": 1.0}  # the factors stay 1: errors are the raw model's


def biased(ttft: float, tpot: float) -> Latencies:
    """What is observed when the model is off by these factors (observed = raw x factor)."""
    return Latencies(RAW.ttft_p50_s * ttft, RAW.ttft_p90_s * ttft, RAW.tpot_p50_s * tpot, RAW.tpot_p90_s * tpot)


def feed(tracker: ModelErrorTracker, observations: list[Latencies], num_finished: int = 20) -> ModelErrorTracker:
    for observed in observations:
        tracker = tracker.record(RAW, observed, num_finished)
    return tracker


def test_relative_error_is_signed_predicted_minus_observed_over_observed():
    tracker = ModelErrorTracker().record(RAW, Latencies(0.4, 0.8, 0.05, 0.125), num_finished=20)
    last = tracker.last
    assert last.scored and last.num_finished == 20
    assert last.relative_error("ttft_p90") == pytest.approx(0.25)  # 1.0 predicted, 0.8 observed: pessimistic
    assert last.relative_error("tpot_p90") == pytest.approx(-0.2)  # 0.1 predicted, 0.125 observed: optimistic
    assert last.relative_error("tpot_p50") == pytest.approx(0.0)


def test_the_correction_is_a_smoothed_average_of_log_observed_over_modelled():
    tracker = feed(ModelErrorTracker(ErrorConfig(smoothing=0.5)), [biased(0.8, 2.0)])
    assert tracker.factors["ttft_p90"] == pytest.approx(0.8 ** 0.5)
    assert tracker.factors["tpot_p50"] == pytest.approx(2.0 ** 0.5)
    tracker = feed(tracker, [biased(0.8, 2.0)])
    assert tracker.factors["ttft_p90"] == pytest.approx(0.8 ** 0.75)
    # the next interval is predicted with the factors learned so far
    assert tracker.corrected(RAW).tpot_p90_s == pytest.approx(0.1 * 2.0 ** 0.75)


def test_a_2x_over_and_under_prediction_cancel_in_the_correction():
    tracker = feed(ModelErrorTracker(ErrorConfig(smoothing=0.5)), [biased(2.0, 2.0), biased(0.5, 0.5)])
    assert tracker.factors["ttft_p90"] == pytest.approx(2 ** -0.25)  # log average, not 1.25


def test_the_correction_converges_on_a_constant_bias_and_the_gate_then_opens():
    tracker, verdicts, errors = ModelErrorTracker(), [], []  # defaults: smoothing 0.5, window 6, 3 needed, 25%
    for _ in range(12):
        tracker = feed(tracker, [biased(2.0, 2.0)])  # the cluster is always twice as slow as modelled
        verdicts.append(may_act(tracker).allowed)
        errors.append(tracker.last.relative_error("ttft_p90"))
    # the n-th prediction is made with factor 2 ** (1 - 0.5 ** (n - 1)): error 2 ** -(0.5 ** (n - 1)) - 1
    assert errors[:3] == pytest.approx([-0.5, 2 ** -0.5 - 1, 2 ** -0.25 - 1])
    assert abs(errors[-1]) < 0.001 and tracker.factors["tpot_p90"] == pytest.approx(2.0, rel=1e-3)
    # recent mean |error|: 32% after 3 intervals, 26% after 4, 22% after 5
    assert verdicts == [False] * 4 + [True] * 8
    assert tracker.slo_scale() == SloScale(ttft=pytest.approx(0.5, rel=1e-3), tpot=pytest.approx(0.5, rel=1e-3))


def test_the_gate_refuses_until_enough_intervals_were_observed():
    tracker = feed(ModelErrorTracker(), [RAW, RAW])
    verdict = may_act(tracker)
    assert not verdict.allowed
    assert verdict.reason == ("only 2 of the 3 intervals needed were observed with >= 10 finished requests: "
                              "the model's error is not known yet")
    assert may_act(feed(tracker, [RAW])).allowed


def test_the_gate_refuses_an_erratic_model_and_names_the_worst_metric():
    erratic = [biased(1.0, 2.0), biased(1.0, 0.5)] * 3  # TPOT alternately 2x and 0.5x the model's
    tracker = feed(ModelErrorTracker(ErrorConfig(**NO_CORRECTION)), erratic)
    assert [i.relative_error("tpot_p90") for i in tracker.recent] == pytest.approx([-0.5, 1.0] * 3)
    assert tracker.recent_error("tpot_p90") == pytest.approx(0.75)
    verdict = may_act(tracker)
    assert not verdict.allowed
    assert verdict.reason == ("recent TPOT p90 error 75% > bound 25% over the last 6 intervals "
                              "(TTFT p90 0%, TPOT p90 75%)")


def test_the_bound_is_configurable():
    erratic = [biased(1.0, 2.0), biased(1.0, 0.5)] * 3
    assert may_act(feed(ModelErrorTracker(ErrorConfig(max_error=0.8, **NO_CORRECTION)), erratic)).allowed
    assert may_act(feed(ModelErrorTracker(ErrorConfig(max_error=math.inf, **NO_CORRECTION)), erratic)).allowed
    assert may_act(ModelErrorTracker(ErrorConfig(max_error=math.inf))) == Verdict(
        True, "no bound on the model's error (max_error inf)")  # inf turns the gate off, even before any interval
    assert not may_act(feed(ModelErrorTracker(ErrorConfig(max_error=0.7, **NO_CORRECTION)), erratic)).allowed


def test_the_recent_error_covers_the_last_window_of_scored_intervals_only():
    config = ErrorConfig(window_intervals=2, min_intervals=1, **NO_CORRECTION)
    tracker = feed(ModelErrorTracker(config), [biased(0.5, 1.0), RAW, biased(1.25, 1.0)])
    assert len(tracker.recent) == 2  # the 0.5x interval (error +100%) fell out of the window
    assert tracker.recent_error("ttft_p90") == pytest.approx(0.1)  # mean of 0% and |1/1.25 - 1| = 20%
    assert may_act(tracker).allowed


def test_intervals_that_cannot_be_judged_move_neither_the_error_nor_the_correction():
    tracker = feed(ModelErrorTracker(), [biased(2.0, 2.0)])
    factors, recent = dict(tracker.factors), tracker.recent
    cases = [
        (tracker.record(RAW, biased(3.0, 3.0), num_finished=9), "9 requests finished, fewer than 10"),
        (tracker.record(RAW, Latencies(0.5, 1.0, None, None), 20), "no TPOT p90 observed"),
        (tracker.record(None, RAW, 20), "the model made no prediction (no traffic, or a pool with no serving replica)"),
        (tracker.record(RAW, RAW, 20, incomparable="the pools changed"), "the pools changed"),
    ]
    for after, reason in cases:
        assert after.last.skipped == reason and not after.last.scored
        assert after.factors == factors and after.recent == recent


def test_the_correction_is_clamped_and_a_bias_beyond_it_keeps_the_gate_shut():
    tracker = feed(ModelErrorTracker(), [biased(100.0, 1.0)] * 20)  # a stalled router: TTFT 100x the model's
    assert tracker.factors["ttft_p90"] == 10.0  # max_factor
    assert tracker.last.relative_error("ttft_p90") == pytest.approx(-0.9)
    assert not may_act(tracker).allowed and "recent TTFT p90 error 90% > bound 25%" in may_act(tracker).reason


def test_the_json_view_has_the_last_interval_the_recent_error_and_the_verdict():
    tracker = feed(ModelErrorTracker(ErrorConfig(max_error=math.inf, min_intervals=1)), [biased(2.0, 1.0)])
    body = json.loads(json.dumps(tracker.as_dict()))  # no Infinity: a JSON parser other than Python's reads it
    assert body["metrics"]["ttft_p90"] == {"predicted_s": 1.0, "raw_predicted_s": 1.0, "observed_s": 2.0,
                                           "error": -0.5, "recent_error": 0.5, "correction": pytest.approx(2 ** 0.5)}
    assert body["max_error"] is None and body["may_act"] is True and body["scored"] is True
    assert body["scored_intervals"] == 1 and body["gated"] == ["ttft_p90", "tpot_p90"]


@pytest.mark.parametrize("overrides, message", [
    ({"max_error": 0.0}, "max_error must be > 0"),
    ({"min_intervals": 7}, "min_intervals <= window_intervals"),
    ({"smoothing": 0.0}, "0 < smoothing <= 1"),
    ({"max_factor": 0.9}, "min_factor <= 1 <= max_factor"),
    ({"gated": ("ttft_p99",)}, "gated must name some of"),
])
def test_an_invalid_error_config_is_refused_with_what_to_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        ErrorConfig(**overrides)
