"""bench/ttft_by_burst.py: how it groups requests by their burst and what it reports per group."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bench_scripts import bench_functions, bench_help

BENCH = bench_functions("ttft_by_burst.py")


def test_the_help_says_what_is_compared_and_how_to_run_it():
    text = bench_help("ttft_by_burst.py")
    assert "--within-ms" in text and "--profile" in text and "python bench/ttft_by_burst.py" in text


def test_a_request_counts_the_arrivals_just_before_it_and_a_burst_at_one_instant_in_send_order():
    arrivals = np.array([0.0, 0.05, 0.5, 0.5, 0.5, 0.58, 2.0])
    assert BENCH["arrivals_before"](arrivals, 0.1).tolist() == [0, 1, 0, 1, 2, 3, 0]
    shuffled = np.array([0.58, 0.0, 0.5, 0.05])
    assert BENCH["arrivals_before"](shuffled, 0.1).tolist() == [1, 0, 0, 1]
    assert BENCH["arrivals_before"](arrivals, 0.0).tolist() == [0] * 7


def test_each_group_reports_its_medians_and_leaves_out_requests_without_a_ttft():
    groups = np.array([0, 0, 1, 1, 1])
    measured = np.array([0.030, 0.040, 0.060, math.nan, 0.080])
    simulated = np.array([0.020, 0.030, 0.050, 0.050, 0.050])
    rows = BENCH["by_group"](groups, measured, simulated)
    assert [(r["group"], r["requests"]) for r in rows] == [(0, 2), (1, 2)]
    assert rows[0]["measured_s"] == pytest.approx(0.035) and rows[0]["difference_s"] == pytest.approx(0.010)
    assert rows[1]["simulated_s"] == pytest.approx(0.050) and rows[1]["difference_s"] == pytest.approx(0.020)
