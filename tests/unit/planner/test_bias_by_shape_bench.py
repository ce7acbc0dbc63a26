"""bench/bias_by_shape.py explains itself, reads rows up to the knee and their signed errors, phases
and batched runs' gaps as its text says (plain values), and closes a kept profile on its own
batched runs (a real simulation: seconds)."""

from pathlib import Path

import pytest

from bench_scripts import bench_functions, bench_help

REPO = Path(__file__).resolve().parents[3]


def row(rate: float, attainment: float, measured: dict, simulated: dict, phases=()) -> dict:
    return {"rate_rps": rate, "measured": {"slo_attainment": attainment, **measured},
            "simulated": simulated, "phases": list(phases)}


def test_the_bias_bench_explains_itself():
    shown = bench_help("bias_by_shape.py")
    assert "--out" in shown and "closure" in shown and "lowest rate" in shown


def test_rows_run_to_the_first_that_misses_and_errors_are_signed():
    f = bench_functions("bias_by_shape.py")
    rows = [row(3.0, 0.5, {}, {}), row(1.0, 1.0, {}, {}), row(2.0, 0.95, {}, {}), row(2.5, 0.8, {}, {})]
    assert [r["rate_rps"] for r in f["rows_to_knee"](rows)] == [1.0, 2.0, 2.5]
    assert [r["rate_rps"] for r in f["rows_to_knee"](rows[1:3])] == [1.0, 2.0]   # none missed: all
    errors = f["signed_errors"]([row(1.0, 1.0, {"median_tpot_ms": 5.0, "p90_tpot_ms": 0.0}, {"median_tpot_ms": 4.0,
                                                                                                "p90_tpot_ms": 3.0}),
                                 row(2.0, 1.0, {"median_tpot_ms": 4.0}, {"median_tpot_ms": 5.0})])
    assert errors == {"median_tpot_ms": [pytest.approx(-0.2), pytest.approx(0.25)]}   # a measured 0 has no ratio


def test_phases_are_means_and_a_phase_too_short_to_read_has_no_error():
    f = bench_functions("bias_by_shape.py")
    phase = lambda name, m50, s50: {"phase": name, "measured_p50_ms": m50, "simulated_p50_ms": s50,  # noqa: E731
                                    "measured_p90_ms": 2 * m50, "simulated_p90_ms": 2 * s50}
    out = f["phase_means"]([row(1.0, 1.0, {}, {}, [phase("steady_gap", 5.0, 4.0), phase("queue", 0.2, 30.0)]),
                            row(1.0, 1.0, {}, {}, [phase("steady_gap", 7.0, 7.0)])])
    assert out["steady_gap p50"] == {"measured_ms": 6.0, "simulated_ms": 5.5, "n": 2,
                                     "signed_error": pytest.approx(-0.1)}
    assert out["queue p50"]["signed_error"] is None and out["queue p90"]["signed_error"] is None


def test_a_batched_runs_gap_is_the_settled_half_of_the_steps_all_of_it_decoded_in():
    mean_gap_s = bench_functions("bias_by_shape.py")["mean_gap_s"]
    steps = [0.5, 0.01, 0.02, 0.03, 0.05, 0.001]
    weight = [3, 4, 4, 4, 4, 2]     # the join step and the last, smaller batch, are not the run's gap
    assert mean_gap_s(steps, weight, 4) == pytest.approx(0.04)
    assert mean_gap_s(steps, weight, 8) is None


def test_closure_is_summarised_by_form_and_batch():
    f = bench_functions("bias_by_shape.py")
    closures = [f["Closure"]("a", "k", "line", 1, 4.0, 3.0), f["Closure"]("b", "k", "line", 1, 4.0, 4.4),
                f["Closure"]("a", "k", "table", 1, 4.0, 4.0)]
    summary = f["closure_summary"](closures)
    assert summary["line b1"] == {"mean": pytest.approx(-0.075), "median": pytest.approx(-0.075), "profiles": 2,
                                  "worst": pytest.approx(-0.25)}
    assert summary["table b1"]["mean"] == 0.0


def test_a_kept_profile_simulated_on_its_own_batched_runs_gets_them_back():
    """The simulator's host model and the served step's netting are one model: a profile's own
    batched runs, replayed, come back within 10% with the served step as a table (which holds each
    batch's measured extra), and the fitted line misses them by its fit's error at most."""
    f = bench_functions("bias_by_shape.py")
    path = REPO / "bench" / "results" / "validate_zen4_s68" / "tiny_zen4_p3.json"
    closures = f["closure"](path, "p3")
    table = {c.batch: c.error for c in closures if c.served_step == "table"}
    line = {c.batch: c.error for c in closures if c.served_step == "line"}
    assert sorted(table) == sorted(line) == [1, 4, 8, 16, 32, 64]
    assert all(abs(error) < 0.10 for error in table.values()), table
    assert all(abs(error) < 0.25 for error in line.values()), line
