"""Measured-vs-simulated comparison (planner/validation.py): the errors the validation reports."""

from __future__ import annotations

import pytest
from rich.console import Console

from planner.validation import Comparison, error_table, mean_abs_errors, plot_validation, to_json


def summary(ttft50: float, ttft90: float, tpot50: float, tpot90: float, attainment: float) -> dict[str, float]:
    return {"median_ttft_ms": ttft50, "p90_ttft_ms": ttft90, "median_tpot_ms": tpot50, "p90_tpot_ms": tpot90,
            "slo_attainment": attainment}


COMPARISONS = [
    Comparison(1.0, "engine", summary(100, 200, 10, 20, 0.95), summary(50, 100, 5, 10, 1.0)),
    Comparison(2.0, "engine", summary(100, 200, 10, 20, 0.80), summary(150, 300, 15, 30, 0.70)),
    Comparison(1.0, "cluster", summary(100, 200, 10, 20, 0.95), summary(110, 190, 10, 22, 0.93)),
]


def test_latency_errors_are_relative_and_attainment_errors_are_points():
    c = COMPARISONS[0]
    assert c.error("median_ttft_ms") == pytest.approx(-0.5)
    assert c.error("slo_attainment") == pytest.approx(0.05)
    assert COMPARISONS[2].error("p90_tpot_ms") == pytest.approx(0.1)


def test_mean_absolute_errors_per_model():
    errors = mean_abs_errors(COMPARISONS, "engine")
    assert errors["median_ttft_ms"] == pytest.approx(0.5) and errors["slo_attainment"] == pytest.approx(0.075)
    assert mean_abs_errors(COMPARISONS, "cluster")["p90_ttft_ms"] == pytest.approx(0.05)
    assert mean_abs_errors(COMPARISONS, "none") == {}


def test_json_table_and_plot(tmp_path):
    data = to_json(COMPARISONS)
    assert [r["model"] for r in data["runs"]] == ["engine", "engine", "cluster"]
    assert data["mean_abs_error"]["cluster"]["median_ttft_ms"] == pytest.approx(0.1)
    console = Console(record=True, width=250)
    console.print(error_table(COMPARISONS, "t"))
    text = console.export_text()
    assert "100.0 / 50.0 (-50%)" in text and "95% / 100% (+5 pp)" in text and "mean |err|" in text
    png = plot_validation(COMPARISONS, tmp_path / "v.png", "t")
    assert png.stat().st_size > 10_000
