"""The pure parts of bench/overload.py (loadgen/comparison/overload.py): good req/s, attainment
among the admitted, the knee, and the verdict at multiples of it, on plain values."""

import pytest

from loadgen.comparison.goodput import Measurement
from loadgen.comparison.overload import knee_rps, overload_points, overload_rates, verdicts


def _run(system, rate, attainment, admitted, refused=0, sent=40):
    summary = {"num_prompts": sent, "slo_attainment": attainment, "admitted_slo_attainment": admitted,
               "refused": refused}
    return Measurement(system, rate, None, {"tight": summary}, 0.0, False)


RUNS = [
    _run("B-slo", 0.4, 1.0, 1.0), _run("B-slo", 0.8, 1.0, 1.0), _run("B-slo", 1.2, 0.8, 0.8),
    _run("B-slo", 1.5, 0.7, 0.95, refused=12), _run("B-slo", 2.0, 0.5, 0.95, refused=19),
    _run("A", 0.4, 1.0, 1.0), _run("A", 0.8, 0.5, 0.5), _run("A", 1.5, 0.1, 0.1), _run("A", 2.0, 0.0, 0.0),
]


def test_good_requests_per_second_are_the_offered_rate_times_the_share_that_met_the_slos():
    points = {(p.system, p.rate_rps): p for p in overload_points(RUNS, "tight")}
    assert points[("B-slo", 1.5)].good_rps == pytest.approx(1.05)
    assert points[("B-slo", 1.5)].refused_share == pytest.approx(0.3)
    assert points[("A", 2.0)].good_rps == 0.0 and points[("A", 2.0)].refused_share == 0.0


def test_every_request_refused_leaves_no_attainment_among_the_admitted():
    (point,) = overload_points([_run("B-slo", 3.0, 0.0, 0.0, refused=40)], "tight")
    assert point.admitted_attainment is None


def test_the_knee_is_where_attainment_first_falls_below_the_target_interpolated():
    knee, bracketed = knee_rps(RUNS, "B-slo", "tight")
    assert bracketed and knee == pytest.approx(0.8 + 0.4 * (1.0 - 0.9) / (1.0 - 0.8))
    with pytest.raises(ValueError, match="no run of C"):
        knee_rps(RUNS, "C", "tight")


def test_overload_rates_are_multiples_of_a_positive_knee():
    assert overload_rates(1.0, (1.5, 2)) == [1.5, 2.0]
    assert overload_rates(0.7777, (1.5,)) == [1.167]
    with pytest.raises(ValueError, match="knee must be > 0"):
        overload_rates(0.0, (1.5,))


def test_the_aim_holds_where_good_rps_stays_near_the_peak_and_the_admitted_meet_their_slos():
    found = {v.multiple: v for v in verdicts(overload_points(RUNS, "tight"), "B-slo", 1.0, (1.5, 2.0))}
    # peak good req/s is 1.05 (at 1.5): there it holds; at 2.0 it keeps 1.0 / 1.05 = 0.95 of it
    assert found[1.5].share_of_peak == pytest.approx(1.0) and found[1.5].holds
    assert found[2.0].share_of_peak == pytest.approx(1.0 / 1.05) and found[2.0].holds
    vllm = {v.multiple: v for v in verdicts(overload_points(RUNS, "tight"), "A", 1.0, (1.5, 2.0))}
    assert not vllm[1.5].holds and not vllm[2.0].holds  # queueing: good req/s collapses
    assert verdicts(overload_points(RUNS, "tight"), "B-slo", 1.0, (3.0,)) == []  # not measured: left out


def test_a_point_whose_admitted_requests_miss_does_not_hold_however_many_are_good():
    runs = [_run("B-slo", 1.0, 1.0, 1.0), _run("B-slo", 1.5, 0.62, 0.85, refused=1)]
    (verdict,) = verdicts(overload_points(runs, "tight"), "B-slo", 1.0, (1.5,))
    assert verdict.share_of_peak == pytest.approx(0.93) and not verdict.holds


def test_the_peak_is_the_best_reached_at_or_below_the_offered_rate_so_a_rise_past_the_knee_is_no_loss():
    # admission refuses the excess, so good req/s keeps rising past the knee (the AMX run's shape)
    runs = [_run("B*", 1.0, 1.0, 1.0), _run("B*", 1.5, 0.85, 0.97, refused=6),
            _run("B*", 2.0, 0.85, 0.93, refused=10)]
    found = {v.multiple: v for v in verdicts(overload_points(runs, "tight"), "B*", 1.0, (1.5, 2.0))}
    assert found[1.5].share_of_peak == pytest.approx(1.0) and found[1.5].holds  # 1.275 of 1.275 reached
    assert found[2.0].share_of_peak == pytest.approx(1.0) and found[2.0].holds  # 1.7 is the new peak
    # a fall past the point reached below it still counts against it
    runs.append(_run("B*", 3.0, 0.4, 0.95, refused=20))
    (three,) = verdicts(overload_points(runs, "tight"), "B*", 1.0, (3.0,))
    assert three.share_of_peak == pytest.approx(1.2 / 1.7) and not three.holds


def test_the_report_gives_each_run_the_machine_speed_it_started_on(tmp_path, monkeypatch):
    import io
    import runpy
    from argparse import Namespace
    from dataclasses import replace
    from pathlib import Path

    from rich.console import Console

    from loadgen.comparison.config import CompareConfig

    bench = Path(__file__).resolve().parents[3] / "bench"
    monkeypatch.syspath_prepend(str(bench))   # the script imports its sibling goodput_vs_vllm, as when run
    overload = runpy.run_path(str(bench / "overload.py"))
    full = {"p90_ttft_ms": 500.0}
    runs = [replace(m, summaries={"tight": m.summaries["tight"] | full}, host_ms_per_product=ms)
            for m, ms in zip(RUNS, (1.0, 1.0, 1.0, 1.0, 1.6, 1.0, 1.0, 1.0, None))]
    points = overload_points(runs, "tight")
    config = CompareConfig(pdserve_systems=("B-slo",), out_dir=tmp_path, label="overload_test", cdf_rates_rps=())
    args = Namespace(pair="tight", system="B-slo", multiples=(1.5, 2.0))
    overload["_report"](config, args, runs, points, 1.0, True, [], [], Console(file=io.StringIO()), 60.0)
    written = (tmp_path / "overload_test.md").read_text()
    assert "| machine speed |" in written and "x1.60" in written
    assert "B-slo @ 2 (x1.60)" in written


def test_a_rate_phase_one_also_ran_is_judged_on_phase_twos_run():
    # a knee of 1.0 req/s: 1.5x is 1.5, which the phase-1 grid held too; phase 2 ran it again, last
    runs = [_run("B", 1.0, 0.9, 0.9), _run("B", 1.5, 0.9, 1.0, refused=4), _run("B", 2.0, 0.6, 1.0, refused=16),
            _run("B", 1.5, 0.75, 0.96, refused=9)]
    (verdict,) = verdicts(overload_points(runs, "tight"), "B", 1.0, (1.5,))
    assert verdict.good_rps == pytest.approx(1.125) and verdict.admitted_attainment == 0.96
    assert verdict.share_of_peak == pytest.approx(1.125 / 1.35) and not verdict.holds   # phase 1's 1.35 is the peak
