"""bench/phase_errors.py: each phase's p50 error per validation, and the runs set side by side."""

from __future__ import annotations

import json

import pytest
from bench_scripts import bench_functions, bench_help

BENCH = bench_functions("phase_errors.py")


def _validation(first_gap_ms: list[tuple[float, float]], steady_ms: tuple[float, float] = (5.0, 5.0)) -> dict:
    return {"runs": [{"rate_rps": i, "phases": [
        {"phase": "first_gap", "measured_p50_ms": real, "simulated_p50_ms": sim},
        {"phase": "steady_gap", "measured_p50_ms": steady_ms[0], "simulated_p50_ms": steady_ms[1]},
        {"phase": "prefill", "measured_p50_ms": 0.0, "simulated_p50_ms": 3.0}]}
        for i, (real, sim) in enumerate(first_gap_ms)]}


def test_the_help_says_what_is_compared_and_how_to_run_it():
    text = bench_help("phase_errors.py")
    assert "python bench/phase_errors.py" in text and "--run" in text and "--resimulate" in text


def test_a_phases_error_is_the_mean_over_rates_and_a_phase_measured_as_zero_is_left_out():
    errors = BENCH["phase_errors"](_validation([(20.0, 15.0), (40.0, 50.0)], steady_ms=(4.0, 5.0)))
    assert errors == {"prefill": None, "first_gap": pytest.approx((0.25 + 0.25) / 2),
                      "steady_gap": pytest.approx(0.25)}


def test_runs_are_set_side_by_side_on_the_validations_they_share(tmp_path):
    for name, sim in (("before", 10.0), ("after", 18.0)):
        for key in ("zen3/1P+1D/trace", "zen3/1P+1D/bursty"):
            if name == "after" and key.endswith("bursty"):
                continue  # only one run has it: not compared
            path = tmp_path / name / key / "validation.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(_validation([(20.0, sim)])))
    runs = {name: BENCH["collect"](tmp_path / name) for name in ("before", "after")}
    rows = BENCH["table"](runs)
    assert [row["key"] for row in rows] == ["zen3/1P+1D/trace"]
    assert rows[0]["first_gap:before"] == pytest.approx(0.5) and rows[0]["first_gap:after"] == pytest.approx(0.1)
    assert BENCH["column_means"](rows)["first_gap:after"] == pytest.approx(0.1)
    assert "| zen3/1P+1D/trace | - / - | 50% / 10% | 0% / 0% |" in BENCH["markdown"](rows, ["before", "after"])
