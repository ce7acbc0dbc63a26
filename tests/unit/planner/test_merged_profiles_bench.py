"""bench/merged_profiles.py's pure parts with plain rows: each profile's mean |goodput error| over the
cases every profile of its set brackets, and the singles taken together against the merged."""

from __future__ import annotations

import pytest

from bench_scripts import bench_functions, bench_help


def row(validation: str, shape: str, profile: str, error: float | None) -> dict:
    return {"set": "s", "validation": validation, "shape": shape, "profile": profile, "profile_file": profile,
            "goodput_error": error, "goodput_measured": 1.0, "goodput_simulated": 1.0, "percentile_error": 0.1}


ROWS = [row("v", "a", "p1", 0.30), row("v", "a", "p2", -0.10), row("v", "a", "merged", 0.05),
        row("v", "b", "p1", 0.20), row("v", "b", "p2", 0.10), row("v", "b", "merged", 0.25),
        row("v", "c", "p1", None), row("v", "c", "p2", 0.50), row("v", "c", "merged", 0.40)]   # p1 past its grid


def test_a_case_one_profile_cannot_bracket_is_left_out_of_every_profiles_mean():
    table = {t["profile"]: t for t in bench_functions("merged_profiles.py")["by_profile"](ROWS)}
    assert table["p1"]["rows"] == table["p2"]["rows"] == table["merged"]["rows"] == 2
    assert table["p1"]["mean_abs_goodput_error"] == pytest.approx(0.25)
    assert table["p2"]["mean_abs_goodput_error"] == pytest.approx(0.10)
    assert table["merged"]["mean_abs_goodput_error"] == pytest.approx(0.15)
    assert (table["p1"]["optimistic_rows"], table["p1"]["past_grid_rows"]) == (2, 1)
    assert table["p2"]["optimistic_rows"] == 1 and table["merged"]["optimistic_rows"] == 2


def test_the_singles_are_pooled_against_the_merged_case_by_case():
    pooled = bench_functions("merged_profiles.py")["pooled"](ROWS)
    assert pooled["cases"] == 2 and pooled["single_rows"] == 4
    assert pooled["single_mean_abs"] == pytest.approx(0.175) and pooled["single_mean_signed"] == pytest.approx(0.125)
    assert pooled["merged_mean_abs"] == pytest.approx(0.15) and pooled["merged_mean_signed"] == pytest.approx(0.15)
    # case a: 0.05 below the singles' mean 0.20 and their worst 0.30; case b: 0.25 above both
    assert pooled["merged_below_singles_mean_abs"] == 1 and pooled["merged_below_worst_single"] == 1


def test_the_help_says_what_is_compared():
    text = " ".join(bench_help("merged_profiles.py").split())
    assert "median" in text and "--set" in text and "resimulated" in text
