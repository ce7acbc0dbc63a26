"""The online decision core as tables: observed state in, target pool sizes out.

The plan stub is the synthetic model of test_planner_search: prefill serves 3 req/s per
replica, decode 2, so the fewest sizes for rate r are (ceil(r/3), ceil(r/2)); an SLO scaled by s
(a corrected model) leaves s times that per replica. The predict stub is a model that always
expects p90 TTFT 0.5 s and TPOT 0.05 s.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.decision import Decision, ObservedLoad, PlannerConfig, SloScale, decide, predict_rate
from planner.pool_sizes import PoolSizes


def plan(rate_rps: float, mean_prompt_tokens: float, mean_output_tokens: float,
         slo_scale: SloScale = SloScale()) -> PoolSizes | None:
    if rate_rps > 60:
        return None  # beyond what the search may use
    return PoolSizes(prefill=math.ceil(round(rate_rps / (3 * slo_scale.ttft), 9)),
                     decode=math.ceil(round(rate_rps / (2 * slo_scale.tpot), 9)))


def predict(sizes: PoolSizes, rate_rps: float, mean_prompt_tokens: float, mean_output_tokens: float):
    return 0.5, 0.05


CONFIG = PlannerConfig(ttft_slo_s=1.0, tpot_slo_s=0.1, min_sizes=PoolSizes(1, 1), max_sizes=PoolSizes(8, 8),
                       scale_up_cooldown_s=30, scale_down_cooldown_s=120, max_step_up=2, max_step_down=1,
                       scale_down_headroom=0.2, predictor="last")


def state(rate: float, current: tuple[int, int], since_s: float = 300.0, ttft_p90_s: float | None = 0.5,
          tpot_p90_s: float | None = 0.05, ready: tuple[int, int] | None = None,
          num_finished: int | None = None) -> ObservedLoad:
    return ObservedLoad(arrival_rate_rps=rate, mean_prompt_tokens=512, mean_output_tokens=128,
                        ttft_p90_s=ttft_p90_s, tpot_p90_s=tpot_p90_s, current=PoolSizes(*current),
                        seconds_since_last_scale=since_s, ready=PoolSizes(*ready) if ready else None,
                        num_finished=num_finished)


CASES = [
    # name, state, config overrides, expected target, a reason that must be given
    ("steady load keeps the sizes", state(4.0, (2, 2)), {}, (2, 2), "predicted 4 req/s"),
    ("load step grows both pools, decode by the step limit", state(9.0, (2, 2)), {}, (3, 4),
     "decode: plan needs 5 > 2"),
    ("growth waits for the scale-up cooldown", state(9.0, (2, 2), since_s=10), {}, (2, 2),
     "scale-up cooldown"),
    ("load drop shrinks one replica per pool per decision", state(1.0, (3, 4)), {}, (2, 3),
     "plan fits 1 < 3 with 20% headroom"),
    ("shrink waits for the longer scale-down cooldown", state(1.0, (3, 4), since_s=60), {}, (3, 4),
     "scale-down cooldown"),
    ("headroom keeps a pool the plain plan would shrink", state(3.9, (2, 3)), {}, (2, 3), "predicted 3.9"),
    ("without headroom the same state shrinks", state(3.9, (2, 3)), {"scale_down_headroom": 0.0}, (2, 2),
     "plan fits 2 < 3"),
    ("bounds cap the growth", state(20.0, (5, 3)), {"max_sizes": PoolSizes(6, 3)}, (6, 3),
     "decode: 5 clamped to bounds [1, 3]"),
    ("observed TPOT over the SLO adds a decode replica", state(4.0, (2, 2), tpot_p90_s=0.15), {}, (2, 3),
     "observed p90 TPOT 0.15s > SLO 0.1s"),
    ("observed TTFT over the SLO turns a prefill shrink into growth", state(1.0, (3, 4), ttft_p90_s=1.5), {}, (4, 3),
     "observed p90 TTFT 1.5s > SLO 1s"),
    ("the guard acts on a p90 of enough requests", state(4.0, (2, 2), tpot_p90_s=0.15, num_finished=10), {}, (2, 3),
     "observed p90 TPOT 0.15s > SLO 0.1s: +1"),
    ("the p90 of a few requests is their slowest: not acted on", state(4.0, (2, 2), tpot_p90_s=0.15, num_finished=3),
     {}, (2, 2), "over only 3 request(s) (< 10): not acted on"),
    ("the bar on the guard is configuration", state(4.0, (2, 2), tpot_p90_s=0.15, num_finished=3),
     {"min_requests_for_guard": 3}, (2, 3), "observed p90 TPOT 0.15s > SLO 0.1s: +1"),
    ("no traffic goes toward the minimum", state(0.0, (3, 3), ttft_p90_s=None, tpot_p90_s=None), {}, (2, 2),
     "no traffic predicted"),
    ("an infeasible load goes toward the maximum", state(100.0, (2, 2)), {}, (4, 4), "maximum sizes"),
    ("bounds apply even during cooldown", state(4.0, (0, 0), since_s=0), {}, (1, 1), "clamped to bounds [1, 8]"),
    ("a pool with replicas still starting does not grow again", state(9.0, (2, 2), ready=(2, 1)), {}, (3, 2),
     "decode: hold at 2, 1 replica(s) still starting"),
    ("starting replicas do not stop the observed-TPOT guard of a ready pool", state(4.0, (2, 2), tpot_p90_s=0.15,
     ready=(1, 2)), {}, (2, 3), "observed p90 TPOT 0.15s > SLO 0.1s"),
    ("starting replicas hold the guard of their own pool", state(4.0, (2, 2), tpot_p90_s=0.15, ready=(2, 1)), {},
     (2, 2), "decode: hold at 2, 1 replica(s) still starting"),
    ("starting replicas hold a shrink of their pool only", state(1.0, (3, 4), ready=(3, 3)), {}, (2, 4),
     "decode: hold at 4, 1 replica(s) still starting"),
]


@pytest.mark.parametrize("name, observed, overrides, expected, reason", CASES, ids=[c[0] for c in CASES])
def test_decision_table(name, observed, overrides, expected, reason):
    decision = decide(observed, replace(CONFIG, **overrides), plan)
    assert decision.target == PoolSizes(*expected)
    assert decision.changed == (decision.target != observed.current)
    assert any(reason in r for r in decision.reasons), decision.reasons


CORRECTION_CASES = [
    # name, state, expected target, a reason that must be given
    ("observed TPOT twice the model's doubles the decode need", state(4.0, (2, 2), tpot_p90_s=0.1), (2, 4),
     "model correction at 2P+2D: TTFT x1.00, TPOT x2.00"),
    ("a model that is right changes nothing", state(4.0, (2, 2), ttft_p90_s=0.5, tpot_p90_s=0.05), (2, 2),
     "predicted 4 req/s"),
    ("the correction is clamped", state(4.0, (2, 2), tpot_p90_s=5.0), (2, 4), "TPOT x10.00"),
    ("a pessimistic model lets pools shrink", state(4.0, (3, 3), ttft_p90_s=0.25), (2, 3), "TTFT x0.50"),
    ("the correction compares with the replicas that served", state(4.0, (2, 3), tpot_p90_s=0.1, ready=(2, 2)),
     (2, 3), "model correction at 2P+2D"),
]


@pytest.mark.parametrize("name, observed, expected, reason", CORRECTION_CASES, ids=[c[0] for c in CORRECTION_CASES])
def test_model_correction_table(name, observed, expected, reason):
    decision = decide(observed, CONFIG, plan, predict)
    assert decision.target == PoolSizes(*expected)
    assert any(reason in r for r in decision.reasons), decision.reasons


def test_a_tracked_correction_replaces_the_one_interval_ratio():
    # predict says the model is right (observed = modelled); the tracked correction says TPOT is 2x
    decision = decide(state(4.0, (2, 2)), CONFIG, plan, predict, scale=SloScale(ttft=1.0, tpot=0.5))
    assert decision.target == PoolSizes(2, 4)
    assert "model correction (tracked): TTFT x1.00, TPOT x2.00" in decision.reasons
    assert not any("model correction at" in r for r in decision.reasons)


def test_no_correction_without_observations():
    decision = decide(state(4.0, (2, 2), ttft_p90_s=None, tpot_p90_s=None), CONFIG, plan, predict)
    assert decision.target == PoolSizes(2, 2) and not any("correction" in r for r in decision.reasons)


@pytest.mark.parametrize("rates, predictor, window, expected", [
    ((1.0, 2.0, 3.0), "last", 3, 3.0),
    ((1.0, 2.0, 3.0), "moving_average", 3, 2.0),
    ((1.0, 2.0, 3.0), "trend", 3, 4.0),
    ((5.0, 2.0, 3.0), "trend", 2, 4.0),
    ((3.0, 1.0), "trend", 3, 0.0),  # a falling trend never predicts a negative rate
    ((7.0,), "trend", 3, 7.0),
])
def test_predict_rate(rates, predictor, window, expected):
    assert predict_rate(rates, predictor, window) == pytest.approx(expected)


def test_trend_predictor_scales_ahead_of_a_ramp():
    ramp = replace(state(6.0, (2, 3)), rate_history_rps=(2.0, 4.0))
    decision = decide(ramp, replace(CONFIG, predictor="trend"), plan)
    assert decision.predicted_rate_rps == pytest.approx(8.0)
    assert decision.target == PoolSizes(3, 4)


def run_oscillating_load(config: PlannerConfig, intervals: int = 20, interval_s: float = 30.0) -> list[Decision]:
    current, since_s, decisions = PoolSizes(2, 3), 1000.0, []
    for i in range(intervals):
        rate = 4.1 if i % 2 else 3.9
        decision = decide(state(rate, (current.prefill, current.decode), since_s=since_s), config, plan)
        decisions.append(decision)
        since_s = interval_s if decision.changed else since_s + interval_s
        current = decision.target
    return decisions


def test_hysteresis_stops_flapping_at_a_boundary():
    assert sum(d.changed for d in run_oscillating_load(CONFIG)) == 0
    no_guard = replace(CONFIG, scale_down_headroom=0.0, scale_up_cooldown_s=0, scale_down_cooldown_s=0)
    assert sum(d.changed for d in run_oscillating_load(no_guard)) == 20


@pytest.mark.parametrize("overrides, message", [
    ({"min_sizes": PoolSizes(3, 1), "max_sizes": PoolSizes(2, 8)}, "min_sizes.prefill=3 exceeds max_sizes.prefill=2"),
    ({"max_step_down": 0}, "can never move"),
    ({"scale_down_headroom": -0.1}, "scale_down_headroom must be >= 0"),
    ({"predictor": "oracle"}, "predictor must be"),
])
def test_invalid_planner_config_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        replace(CONFIG, **overrides)
