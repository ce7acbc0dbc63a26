"""The pure parts of bench/host_speed.py (loadgen/comparison/host_speed.py): the swing of a phase's
windows, whether the cores slow each other, and the verdict on the machine; and the tool's --help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.comparison.host_speed import (drift_note, phase_speed, speed_factors, speed_summary, together_over_alone,
                                           verdict, wake_note)

REPO = Path(__file__).resolve().parents[3]


def test_a_phase_swing_is_p90_over_p10_of_its_windows():
    steady = phase_speed("core 0 alone", [10.0] * 20)
    assert (steady.p10_ms, steady.p50_ms, steady.p90_ms, steady.swing, steady.windows) == (10.0, 10.0, 10.0, 1.0, 20)
    # the windows this session's VM gave with nothing else running: 7.4 to 15.7 ms
    seen = phase_speed("core 0 alone", [8.1, 7.8, 15.7, 13.4, 7.9, 7.7, 7.4, 11.3, 8.7, 8.4,
                                         13.6, 12.2, 9.5, 9.9, 11.1, 9.6, 13.4, 10.1, 8.3, 8.7])
    assert seen.min_ms == 7.4 and seen.max_ms == 15.7
    assert 1.6 < seen.swing < 1.8
    with pytest.raises(ValueError, match="no windows"):
        phase_speed("x", [])
    with pytest.raises(ValueError, match="must be > 0"):
        phase_speed("x", [1.0, 0.0])


def test_cores_that_share_a_physical_core_are_slower_together_than_alone():
    alone = [phase_speed("core 0 alone", [10.0] * 5), phase_speed("core 1 alone", [12.0] * 5)]
    apart = [phase_speed("core 0 with", [10.0] * 5), phase_speed("core 1 with", [12.0] * 5)]
    shared = [phase_speed("core 0 with", [18.0] * 5), phase_speed("core 1 with", [22.0] * 5)]
    assert together_over_alone(alone, apart) == pytest.approx(1.0)
    assert together_over_alone(alone, shared) == pytest.approx(20.0 / 11.0)


def test_the_verdict_names_what_makes_a_machine_unfit_for_close_comparisons():
    alone = [phase_speed("core 0 alone", [10.0, 10.2, 9.9, 10.1] * 5)]
    calm = [phase_speed("core 0 with the others busy", [10.1, 10.3, 10.0, 10.2] * 5)]
    good = verdict(alone, calm)
    assert good.steady and good.text.startswith("steady")

    swinging = [phase_speed("core 0 with the others busy", [8.0, 16.0, 8.0, 12.0] * 5)]
    bad = verdict(alone, swinging)
    assert not bad.steady and "its speed swings: core 0 with the others busy" in bad.text

    sharing = [phase_speed("core 0 with the others busy", [15.0, 15.1, 14.9, 15.0] * 5)]
    bad = verdict(alone, sharing)
    assert not bad.steady and "slow each other: 1.49x" in bad.text
    # a looser bar calls the same machine steady
    assert verdict(alone, sharing, max_swing=1.6).steady
    with pytest.raises(ValueError, match="max_swing must be > 1"):
        verdict(alone, calm, max_swing=1.0)


def test_the_tool_explains_itself():
    shown = subprocess.run([sys.executable, str(REPO / "bench" / "host_speed.py"), "--help"],
                           capture_output=True, text=True, check=True, timeout=60)
    assert "steady enough to compare figures" in shown.stdout and "--phase-s" in shown.stdout


def test_each_run_carries_its_machine_speed_against_the_runs_median():
    assert speed_factors([1.0, 1.2, None, 0.8]) == [pytest.approx(1.0), pytest.approx(1.2), None, pytest.approx(0.8)]
    assert speed_factors([None, None]) == [None, None]
    with pytest.raises(ValueError, match="must be > 0"):
        speed_factors([1.0, 0.0])
    # the AMX VM's swing: one run began on a machine 1.6x slower than usual
    line = speed_summary([0.77, 0.78, 1.25, 0.76, None], ["A @ 1", "B @ 1", "B @ 1.5", "A @ 1.5", "A @ 2"])
    assert "median 0.78 ms per product" in line and "over 4 runs" in line
    assert "1 started over 1.25x slower than the median: B @ 1.5 (x1.61)" in line
    assert "none started" in speed_summary([0.77, 0.80], ["A @ 1", "B @ 1"])
    assert "not checked" in speed_summary([None], ["A @ 1"])
    with pytest.raises(ValueError, match="labels"):
        speed_summary([1.0], [])


def test_the_speed_check_times_a_real_product_on_every_core():
    from loadgen.host_probe import run_phase, speed_check_ms

    cores = sorted(os.sched_getaffinity(0))[:2]
    windows = run_phase(cores, seconds=0.3, window_s=0.1)
    assert sorted(windows) == cores and all(len(w) >= 2 and min(w) > 0 for w in windows.values())
    assert speed_check_ms(cores, seconds=0.3, window_s=0.1) > 0
    with pytest.raises(ValueError, match="window_s <= seconds"):
        run_phase(cores, seconds=0.1, window_s=0.5)


def test_the_speed_check_times_the_engines_arithmetic_where_they_compute_in_half_precision():
    from loadgen.host_probe import describe_product, product_for_dtype, run_phase, speed_check_ms

    assert [product_for_dtype(d) for d in ("bfloat16", "bf16", "half", "float16", "float32", "float", "auto")] == \
        ["bfloat16", "bfloat16", "float16", "float16", "float32", "float32", "float32"]
    assert describe_product("float32") == "float32 384x384 (numpy)"
    assert describe_product("bfloat16") == "bfloat16 256x768 @ 768x3072 (torch)"
    core = sorted(os.sched_getaffinity(0))[:1]
    windows = run_phase(core, seconds=0.3, window_s=0.1, product="bfloat16")
    assert sorted(windows) == core and min(windows[core[0]]) > 0
    # a window holds at least one product: two or more windows, or one product longer than a window
    # (an AVX2-only EPYC has no bfloat16 unit: oneDNN's reference path took 1.4 s a product)
    assert len(windows[core[0]]) >= 2 or windows[core[0]][0] >= 100, windows
    with pytest.raises(ValueError, match="unknown product 'int8'"):
        speed_check_ms(core, seconds=0.3, window_s=0.1, product="int8")


def test_a_probe_on_another_core_is_not_handed_its_callers_openmp_binding(monkeypatch, capfd):
    """A profiler runs vLLM in its own process with OMP_PLACES naming the engine's core; a probe
    spawned from there binds itself to another core, where libgomp rejected the inherited places."""
    from loadgen.host_probe import run_phase

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores: the caller's and the probe's")
    monkeypatch.setenv("OMP_PLACES", f"{{{cores[0]}}}")
    monkeypatch.setenv("OMP_PROC_BIND", "true")
    windows = run_phase([cores[1]], seconds=0.3, window_s=0.1, product="bfloat16")
    assert min(windows[cores[1]]) > 0
    assert "libgomp" not in capfd.readouterr().err
    assert os.environ["OMP_PLACES"] == f"{{{cores[0]}}}" and os.environ["OMP_PROC_BIND"] == "true"  # restored


def test_a_profile_says_how_far_the_machine_moved_while_it_was_measured():
    assert drift_note(0.0, 0.8) == "" and drift_note(0.8, 0.0) == ""
    assert "0.77 ms per product at the start, 0.80 at the end (within 1.04x)" in drift_note(0.77, 0.80)
    assert "moved 1.50x while measured" in drift_note(1.2, 0.8)
    assert "2.70 ms per bfloat16 product at the start" in drift_note(2.7, 2.8, product="bfloat16")


def test_the_wake_up_check_times_a_real_round_trip_between_two_processes():
    from loadgen.host_probe import wake_check_us

    cores = sorted(os.sched_getaffinity(0))
    across = wake_check_us(cores[:2], rounds=20, idle_s=0.001)
    alone = wake_check_us(cores[:1], rounds=20, idle_s=0.0)
    assert 0 < across < 1e6 and 0 < alone < 1e6
    assert os.sched_getaffinity(0) == set(cores)   # the caller's affinity restored
    for bad in ({"rounds": 0}, {"idle_s": -1.0}):
        with pytest.raises(ValueError, match="need rounds >= 1"):
            wake_check_us(cores, **bad)
    with pytest.raises(ValueError, match="no cores"):
        wake_check_us([])


def test_a_profile_says_how_far_the_wake_up_moved_while_it_was_measured():
    assert wake_note(0.0, 70.0) == ""
    assert wake_note(70.0, 75.0) == "wake-up round trip 70 us at the start, 75 at the end (within 1.07x)"
    assert "moved 3.00x while measured: the serving costs hold at neither" in wake_note(200.0, 600.0)


def test_the_interpreter_sampler_times_a_python_loop_in_cpu_time_on_every_core_while_inside():
    import time

    from loadgen.host_probe import InterpreterSampler, interpreter_cpu_ms, mean_interpreter_ms

    assert interpreter_cpu_ms(2_000) > 0
    cores = sorted(os.sched_getaffinity(0))
    with InterpreterSampler(cores, period_s=0.01) as sampler:
        entered_s = time.monotonic()   # every core sampled once before the span began
        sum(i * i for i in range(200_000))   # the span: some work of this process's own
    assert sorted(sampler.samples) == cores
    assert entered_s - 1.0 < sampler.entered_s <= entered_s < sampler.exited_s   # the span's bounds
    for samples in sampler.samples.values():
        assert len(samples) >= 1 and samples[0][0] <= entered_s
        assert all(a[0] < b[0] for a, b in zip(samples, samples[1:]))   # in time order
        assert all(ms > 0 for _, ms in samples)
    assert sampler.mean_ms == pytest.approx(mean_interpreter_ms(sampler.samples))
    assert mean_interpreter_ms({0: [(1.0, 1.0), (2.0, 3.0)], 1: [(1.5, 2.0)]}) == pytest.approx(2.0)
    assert mean_interpreter_ms({}) == 0.0
    for bad in ({"cores": []}, {"cores": cores, "period_s": 0.0}):
        with pytest.raises(ValueError, match="need cores and period_s > 0"):
            InterpreterSampler(**bad)


def test_the_interpreter_series_is_each_cores_mean_window_by_window_from_the_runs_start():
    from loadgen.host_probe import interpreter_series, series_spread

    samples = {0: [(9.9, 7.0), (10.1, 1.0), (10.6, 3.0), (12.2, 5.0), (13.0, 9.0)], 1: [(11.5, 4.0)]}
    # from 10.0 to 12.5: windows [10, 11), [11, 12), [12, 12.5); 9.9 is before, 13.0 after
    assert interpreter_series(samples, 10.0, 12.5) == {0: [2.0, None, 5.0], 1: [None, 4.0, None]}
    assert interpreter_series(samples, 10.0, 12.5, window_s=2.0) == {0: [2.0, 5.0], 1: [4.0, None]}
    assert interpreter_series({0: []}, 5.0, 5.0) == {0: [None]}   # an empty span is one empty window
    assert series_spread([[1.0, None, 2.0], [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]]) == pytest.approx((1.9, 9.1))
    assert series_spread([[None, 1.0]]) is None   # one window: no spread
    for bad in ({"window_s": 0.0}, {"end_s": 9.0}):
        with pytest.raises(ValueError, match="need window_s > 0 and end_s >= start_s"):
            interpreter_series(samples, **({"start_s": 10.0, "end_s": 12.0} | bad))


def test_the_interpreter_loop_is_timed_window_by_window_as_the_products_are():
    from loadgen.host_probe import CHECKS, PRODUCTS, describe_product, run_phase

    assert "python" in CHECKS and "python" not in PRODUCTS   # a profile's compute check stays a product
    assert "pure-Python loop" in describe_product("python")
    core = sorted(os.sched_getaffinity(0))[0]
    windows = run_phase([core], 0.4, 0.2, "python")
    assert list(windows) == [core] and len(windows[core]) >= 1 and all(ms > 0 for ms in windows[core])
