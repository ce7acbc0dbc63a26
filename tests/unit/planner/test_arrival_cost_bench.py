"""bench/arrival_cost.py: when its short requests are sent, and what it makes of the rounds."""

from __future__ import annotations

import pytest
from bench_scripts import bench_functions, bench_help

BENCH = bench_functions("arrival_cost.py")


def test_the_help_says_what_is_measured_and_how_to_run_it():
    text = bench_help("arrival_cost.py")
    assert "prefill core" in text and "--prompt-tokens" in text and "python bench/arrival_cost.py" in text


def test_spaced_arrivals_spread_over_the_prompts_step_and_a_burst_goes_at_once():
    offsets = BENCH["arrival_offsets_s"]
    assert offsets("spaced", 3, 0.1) == pytest.approx([0.03, 0.05, 0.07])
    assert offsets("burst", 4, 0.1) == pytest.approx([0.03] * 4)
    assert offsets("spaced", 1, 0.2) == pytest.approx([0.06])


def test_each_case_is_its_median_against_the_lone_prompts_median_per_arrival():
    rows = [{"arrivals": 2, "spacing": "spaced", "alone_s": a, "with_s": w}
            for a, w in ((0.100, 0.120), (0.102, 0.118), (0.098, 0.130))]
    rows += [{"arrivals": 4, "spacing": "burst", "alone_s": 0.100, "with_s": 0.116}]
    summary = BENCH["summarize"](rows)
    assert [(s["arrivals"], s["spacing"]) for s in summary] == [(2, "spaced"), (4, "burst")]
    assert summary[0]["delay_s"] == pytest.approx(0.020) and summary[0]["delay_per_arrival_s"] == pytest.approx(0.010)
    assert summary[1]["delay_per_arrival_s"] == pytest.approx(0.004)
    assert "| 4 | burst | 1 | 100.0 | 16.0 | 4.0 |" in BENCH["table"](summary)
