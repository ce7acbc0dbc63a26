"""The floor under a validation's latency error (planner/validation_noise.py): each request's TTFT and
TPOT from its phases, and how far a measured percentile moves on a resample of the run's requests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rich.console import Console

from planner.validation import Comparison, error_and_noise, verdict, verdict_table, verdicts_to_json
from planner.validation_noise import latencies_ms, measured_noise, percentile_noise

NAN = math.nan


def test_each_requests_ttft_and_tpot_come_from_its_phases_and_one_without_them_is_left_out():
    phases = {"queue": [0.01, 0.0, NAN, 0.002], "prefill": [0.09, 0.05, NAN, 0.048],
              "first_gap": [0.03, 0.02, NAN, NAN], "steady_gap": [0.01, NAN, NAN, NAN]}
    series = latencies_ms(phases, [4, 2, 8, 1])   # 4 tokens; 2 tokens: the first gap alone; refused; 1 token
    assert series["ttft"] == pytest.approx([100.0, 50.0, 50.0])
    assert series["tpot"] == pytest.approx([(30 + 2 * 10) / 3, 20.0])   # a one-token output has no TPOT


def test_identical_latencies_have_no_sampling_noise_and_two_values_are_the_least_that_have_any():
    assert percentile_noise(np.full(40, 7.0), 90) == 0.0
    assert percentile_noise(np.array([5.0]), 50) is None
    assert percentile_noise(np.array([0.0, 0.0]), 50) is None   # a percentile of 0: no relative noise
    # two values 1 and 3: each resample's median is 1 (a quarter of them), 2 (half) or 3 (a quarter)
    assert percentile_noise(np.array([1.0, 3.0]), 50, draws=20_000) == pytest.approx(0.5 * 1 / 2, abs=0.02)


def test_the_noise_falls_as_the_run_grows_and_a_bimodal_median_is_the_noisiest():
    rng = np.random.default_rng(1)
    small, large = rng.exponential(100.0, 30), rng.exponential(100.0, 480)
    assert percentile_noise(large, 90) < 0.5 * percentile_noise(small, 90)
    bimodal = np.concatenate([np.full(15, 20.0), np.full(15, 300.0)])   # short prompts and long ones, half each
    assert percentile_noise(bimodal, 50) > 5 * percentile_noise(rng.normal(160.0, 10.0, 30), 50)


def test_a_runs_noise_is_per_latency_key_and_seeded():
    rng = np.random.default_rng(2)
    n = 60
    phases = {"queue": list(rng.uniform(0, 0.01, n)), "prefill": list(rng.uniform(0.02, 0.2, n)),
              "first_gap": list(rng.uniform(0.01, 0.05, n)), "steady_gap": list(rng.uniform(0.004, 0.006, n))}
    noise = measured_noise(phases, [32] * n)
    assert set(noise) == {"median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms"}
    assert noise == measured_noise(phases, [32] * n)
    assert noise["median_tpot_ms"] < noise["median_ttft_ms"]   # steady gaps within 20%; prompts 10x apart


def _summary(ttft50: float, attainment: float) -> dict[str, float]:
    return {"median_ttft_ms": ttft50, "p90_ttft_ms": 2 * ttft50, "median_tpot_ms": 10.0, "p90_tpot_ms": 20.0,
            "slo_attainment": attainment}


def test_a_verdict_carries_the_mean_noise_up_to_the_knee_beside_the_error():
    noise_1 = {"median_ttft_ms": 0.02, "p90_ttft_ms": 0.10, "median_tpot_ms": None, "p90_tpot_ms": 0.01}
    noise_2 = {"median_ttft_ms": 0.04, "p90_ttft_ms": 0.20, "median_tpot_ms": None, "p90_tpot_ms": 0.03}
    rows = [Comparison(1.0, "m", _summary(100, 1.0), _summary(110, 1.0), noise=noise_1),
            Comparison(2.0, "m", _summary(100, 0.95), _summary(130, 1.0), noise=noise_2),
            Comparison(3.0, "m", _summary(100, 0.5), _summary(100, 0.9), noise={"median_ttft_ms": 0.9})]   # past the knee
    v = verdict(rows, "trace", "1P+1D", "m")
    assert v.noise_to_knee["median_ttft_ms"] == pytest.approx(0.03) and v.noise_to_knee["p90_ttft_ms"] == pytest.approx(0.15)
    assert v.noise_to_knee["median_tpot_ms"] is None
    assert verdicts_to_json([v])[0]["mean_noise_to_knee"]["p90_tpot_ms"] == pytest.approx(0.02)
    assert error_and_noise(0.2, 0.03) == "20% (n 3%)" and error_and_noise(0.2, None) == "20%"
    assert error_and_noise(0.2, 0.03, -0.15) == "20% (-15%, n 3%)" and error_and_noise(0.2, None, 0.2) == "20% (+20%)"
    console = Console(record=True, width=250)
    console.print(verdict_table([v], {("trace", "1P+1D"): (1.0, 2.0, 3.0)}))
    # TTFT p50: (10% + 30%) / 2, both over: +20%, beside (2% + 4%) / 2
    assert "20% (+20%, n 3%)" in console.export_text()
