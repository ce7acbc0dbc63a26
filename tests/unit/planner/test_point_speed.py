"""`planner.profiler.point_speed`: a profile's timed points moved to its mean interpreter speed,
with plain values and a profile whose slow seconds are known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.perf_model import fit_perf_model
from planner.profile import DecodeSample, load_profile, save_profile
from planner.profiler.point_speed import (SpeedSeries, at_mean_speed, profile_at_mean_speed, rows_at_mean_speed,
                                          runs_at_mean_speed)
from planner.profiler.served_refit import kept_row, kept_window, refitted
from planner.profiler.stream_fit import BatchRun, engine_step_s
from planner.profiles.example import build_example_profile
from planner.serving_costs import ServingCosts

# two cores, 1 s windows from t = 100 s: core 0 missed its third window
SERIES = SpeedSeries(100.0, 1.0, ((0, (1.0, 2.0, None, 1.0)), (1, (1.0, 2.0, 3.0, 1.0))))
MEAN_MS = 11 / 7


def test_a_span_is_the_overlap_weighted_mean_of_every_core_over_the_series_mean():
    assert SERIES.mean_ms == pytest.approx(MEAN_MS)
    assert SERIES.ms_over(100.5, 101.5) == pytest.approx(1.5)          # half of window 0, half of window 1
    assert SERIES.ms_over(100.0, 101.0) == pytest.approx(1.0)          # window 0 exactly
    assert SERIES.ms_over(102.2, 102.2) == pytest.approx(3.0)          # no length: its window, the core that sampled
    assert SERIES.ms_over(101.75, 103.0) == pytest.approx((0.25 * 2 + 0.25 * 2 + 1.0 * 3) / 1.5)   # each core's sample
    assert SERIES.ratio_over(101.0, 102.0) == pytest.approx(2.0 / MEAN_MS)
    assert SERIES.ms_over(200.0, 201.0) is None and SERIES.ratio_over(90.0, 95.0) is None   # outside it
    with pytest.raises(ValueError, match="end after it starts"):
        SERIES.ms_over(101.0, 100.0)


def test_a_step_moves_to_the_mean_by_its_elasticity():
    assert at_mean_speed(0.010, 1.44, 0.5) == pytest.approx(0.010 / 1.2)   # a 1.44x slow loop, a 1.2x long step
    assert at_mean_speed(0.010, 1.5, 1.0) == pytest.approx(0.010 / 1.5)
    assert at_mean_speed(0.010, 0.8, 1.0) == pytest.approx(0.0125)     # read fast: longer at the mean
    assert at_mean_speed(0.010, 1.5, 0.0) == at_mean_speed(0.010, 1.0, 0.7) == pytest.approx(0.010)
    with pytest.raises(ValueError):
        at_mean_speed(0.010, 0.0, 0.5)


def test_only_timed_rows_inside_the_series_move():
    rows = (DecodeSample(1, 16, 0.010, 101.0, 102.0),     # the slow second: 2 / (11/7)
            DecodeSample(1, 32, 0.010),                   # no time kept
            DecodeSample(2, 32, 0.010, 300.0, 301.0))     # after the series
    moved, ratios = rows_at_mean_speed(rows, SERIES, 1.0)
    assert ratios == [pytest.approx(2.0 / MEAN_MS), None, None]
    assert moved[0].step_s == pytest.approx(0.010 * MEAN_MS / 2.0)
    assert moved[1:] == rows[1:] and (moved[0].start_s, moved[0].end_s) == (101.0, 102.0)
    runs = ((1.0, 0.020, 100.0, 50.0), (4.0, 0.030, 400.0, 130.0))
    assert runs_at_mean_speed(runs, (), SERIES, 1.0) == runs   # windows not kept: as they were
    moved_runs = runs_at_mean_speed(runs, ((101.0, 102.0), (0.0, 0.0)), SERIES, 0.5)
    assert moved_runs[0][1] == pytest.approx(0.020 / (2.0 / MEAN_MS) ** 0.5) and moved_runs[1] == runs[1]


def slowed(profile, series: SpeedSeries, elasticity: float):
    """`profile` as a VM that swings as `series` says would have measured it: each decode row read
    over one window in turn, its step that window's ratio slower at `elasticity`."""
    windows = len(series.by_core[0][1])
    rows = []
    for i, row in enumerate(profile.decode):
        start = series.start_s + (i % windows) * series.window_s
        ratio = series.ratio_over(start, start + series.window_s)
        rows.append(replace(row, step_s=row.step_s * ratio ** elasticity, start_s=start,
                            end_s=start + series.window_s))
    return tuple(rows)


def test_a_profile_read_over_slow_and_fast_seconds_gets_its_steps_and_served_extras_back(tmp_path):
    base = build_example_profile()
    series = SpeedSeries(50.0, 1.0, ((0, (0.8, 1.6, 1.0, 1.2, 0.9)), (1, (0.8, 1.4, 1.0, 1.0, 0.9))))
    hardware = replace(base.hardware, machine_interp_series_ms=series.by_core, machine_interp_window_s=1.0,
                       machine_interp_start_s=50.0)
    # the served runs: each the engine's step plus a known extra, read over a window of its own
    model = fit_perf_model(base).model
    extra = {1: 0.004, 4: 0.005, 16: 0.008, 32: 0.012}
    runs, windows = [], []
    for k, (batch, extra_s) in enumerate(extra.items()):
        start = 50.0 + k
        ratio = series.ratio_over(start, start + 1.0)
        served = engine_step_s(batch, batch * 200, model, base.decode) + extra_s
        runs.append(BatchRun(batch, served * ratio ** 0.5, batch * 200, 500.0, 0.0, 0,
                             start_s=start, end_s=start + 1.0))
        windows.append(kept_window(runs[-1]))
    true_serving = refitted(ServingCosts(served_batch_runs=tuple(
        (float(b), engine_step_s(b, b * 200, model, base.decode) + s, b * 200.0, 500.0) for b, s in extra.items()),
        served_step_extra_s=((1.0, 0.0),)), model, base.decode)
    measured = replace(base, hardware=hardware, decode=slowed(base, series, 1.0),
                       serving=ServingCosts(served_batch_runs=tuple(kept_row(run) for run in runs),
                                            served_batch_windows_s=tuple(windows), served_step_extra_s=((1.0, 0.0),)))
    save_profile(measured, tmp_path / "measured.json")   # the times survive the file
    measured = load_profile(tmp_path / "measured.json")
    assert [row.start_s for row in measured.decode][:3] == [50.0, 51.0, 52.0]

    moved = profile_at_mean_speed(measured, elasticity=1.0, served_elasticity=0.5)
    assert [row.step_s for row in moved.decode] == pytest.approx([row.step_s for row in base.decode])
    assert fit_perf_model(moved).decode_mape < fit_perf_model(measured).decode_mape
    assert [s for _, s in moved.serving.served_step_extra_s] == pytest.approx(
        [s for _, s in true_serving.served_step_extra_s], abs=1e-9)
    assert moved.serving.decode_step_s == pytest.approx(true_serving.decode_step_s, abs=1e-9)
    assert moved.serving.decode_cpu_s_per_token == pytest.approx(true_serving.decode_cpu_s_per_token, abs=1e-12)
    # at the wrong elasticity the rows do not come back
    wrong = profile_at_mean_speed(measured, elasticity=0.0)
    assert [row.step_s for row in wrong.decode] == [row.step_s for row in measured.decode]
    # a profile without its series is left as it was
    assert profile_at_mean_speed(base, 1.0) is base


def test_the_bench_sets_two_profiles_of_one_vm_side_by_side_and_finds_the_elasticity_they_followed(tmp_path):
    from bench_scripts import bench_functions, bench_help

    bench = bench_functions("profile_at_mean_speed.py")
    assert "python bench/profile_at_mean_speed.py" in bench_help("profile_at_mean_speed.py")
    base = build_example_profile()
    paths = []
    # the same VM profiled twice, its slow seconds falling on different rows each time; the steps
    # followed the interpreter at half its swing
    for name, series in (("a", SpeedSeries(10.0, 1.0, ((0, (0.8, 1.6, 1.0, 1.2, 0.9)),))),
                         ("b", SpeedSeries(90.0, 1.0, ((0, (1.5, 0.8, 1.3, 0.9, 1.0)),)))):
        hardware = replace(base.hardware, machine_interp_series_ms=series.by_core, machine_interp_start_s=series.start_s)
        save_profile(replace(base, hardware=hardware, decode=slowed(base, series, 0.5)), tmp_path / f"{name}.json")
        paths.append(tmp_path / f"{name}.json")
    result = bench["report"](paths, [0.0, 0.5, 1.0], None)
    apart = {entry["elasticity"]: entry["agreement"]["rows_apart"] for entry in result["by_elasticity"]}
    assert apart[0.5] == pytest.approx(0.0, abs=1e-9) and apart[0.0] > 0.05 and apart[1.0] > 0.01
    assert "| 0.5 |" in bench["markdown"](result)
    bench["plot"](result, tmp_path / "agreement.png")
    assert (tmp_path / "agreement.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="kept no interpreter series"):
        save_profile(base, tmp_path / "old.json")
        bench["report"]([tmp_path / "old.json"], [1.0], None)


def test_engine_rows_keep_their_times_through_the_file_and_untimed_rows_are_written_as_before(tmp_path):
    import json

    base = build_example_profile()
    timed = replace(base, prefill=(replace(base.prefill[0], start_s=12.5, end_s=13.0), *base.prefill[1:]),
                    decode=(replace(base.decode[0], start_s=20.0, end_s=20.25), *base.decode[1:]))
    save_profile(timed, tmp_path / "timed.json")
    back = load_profile(tmp_path / "timed.json")
    assert (back.prefill[0].start_s, back.prefill[0].end_s) == (12.5, 13.0)
    assert (back.decode[0].start_s, back.decode[0].end_s) == (20.0, 20.25) and back.decode[0].timed
    assert back == base   # the times are not part of a row's identity
    rows = json.loads((tmp_path / "timed.json").read_text())
    assert "start_s" not in rows["prefill"][1] and "end_s" not in rows["decode"][1]
    from planner.profile import PrefillSample, ProfileError
    with pytest.raises(ProfileError, match="0 <= start_s <= end_s"):
        PrefillSample(64, 2048, 0.01, start_s=5.0, end_s=4.0)


def test_a_profile_keeps_one_window_per_batched_run_or_none():
    from planner.profile import ProfileError

    run = (1.0, 0.01, 100.0, 90.0)
    assert ServingCosts(served_batch_runs=(run,), served_batch_windows_s=([2, 3],)).served_batch_windows_s == ((2.0, 3.0),)
    assert ServingCosts(served_batch_runs=(run,)).served_batch_windows_s == ()
    with pytest.raises(ProfileError, match="2 windows for 1 served_batch_runs"):
        ServingCosts(served_batch_runs=(run,), served_batch_windows_s=((1, 2), (3, 4)))
    with pytest.raises(ProfileError, match="0 <= start <= end"):
        ServingCosts(served_batch_runs=(run,), served_batch_windows_s=((3, 2),))
    with pytest.raises(ProfileError, match="a step above 0"):
        ServingCosts(served_batch_runs=((1.0, 0.0, 100.0, 90.0),))
