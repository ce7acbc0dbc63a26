"""bench/refit_served_step.py: a profile's served step fitted again from the runs it kept."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench_scripts import bench_functions, bench_help

from planner.perf_model import fit_perf_model
from planner.profile import load_profile, save_profile
from planner.profiler.served_refit import kept_row
from planner.profiler.stream_fit import BatchRun, engine_step_s, served_step_error
from planner.profiles.example import build_example_profile
from planner.serving_costs import ServingCosts

REFIT = bench_functions("refit_served_step.py")


def test_the_help_says_what_it_refits_and_how_to_compare():
    text = bench_help("refit_served_step.py")
    assert "python bench/refit_served_step.py" in text and "served_batch_runs" in text and "--resimulate" in text


def test_a_profile_is_refitted_to_a_table_that_charges_its_runs_closer_than_its_line(tmp_path):
    profile = build_example_profile()
    model = fit_perf_model(profile).model
    extra = {1: 0.004, 4: 0.005, 16: 0.01, 64: 0.09}   # convex, as measured, on an engine of ~10 ms steps
    # served = the engine's step as the refit reads it (its table's row, moved along the context) + the extra
    runs = [BatchRun(b, engine_step_s(b, b * 200, model, profile.decode) + s, b * 200, 500.0, 0.0, 0) for b, s in extra.items()]
    line = ServingCosts(decode_step_s=0.0, decode_cpu_s_per_token=0.0013, handoff_s=0.004,
                        served_batch_runs=tuple(kept_row(run) for run in runs))
    save_profile(replace(profile, serving=line), tmp_path / "line.json")
    said = REFIT["refit"](tmp_path / "line.json", tmp_path / "table.json")
    refitted = load_profile(tmp_path / "table.json")
    assert [b for b, _ in refitted.serving.served_step_extra_s] == list(extra)
    assert [s for _, s in refitted.serving.served_step_extra_s] == pytest.approx(list(extra.values()))
    assert served_step_error(runs, model, refitted.serving, True, profile.decode) == pytest.approx(0.0, abs=1e-9)
    assert served_step_error(runs, model, refitted.serving, False, profile.decode) > 0.05
    assert "b64 +90.00" in said[0] and refitted.decode == profile.decode   # only the served step changes
    assert load_profile(tmp_path / "line.json").serving.served_step_extra_s == ()   # the input is left as it was


def test_a_profile_that_kept_no_runs_is_refused_naming_what_to_do(tmp_path):
    save_profile(build_example_profile(), tmp_path / "old.json")
    with pytest.raises(SystemExit, match="kept no batched runs"):
        REFIT["refit"](tmp_path / "old.json", tmp_path / "new.json")
