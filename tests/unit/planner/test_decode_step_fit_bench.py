"""bench/decode_step_fit.py explains itself and fits the traces it finds (a benchmark's reading of
real runs; here on a hand-made trace against a real profile)."""

import json
from pathlib import Path

import pytest

from bench_scripts import bench_functions, bench_help

REPO = Path(__file__).resolve().parents[3]


def test_the_decode_step_fit_explains_itself():
    shown = bench_help("decode_step_fit.py")
    assert "--traces" in shown and "--step-trace" in shown and "a + b x batch" in shown


def test_the_fit_reads_the_decode_traces_under_each_directory_and_says_what_each_charge_misses(tmp_path):
    from pdserve.engine_step_trace import STEP_COLUMNS
    from planner.perf_model import fit_perf_model
    from planner.profile import load_profile

    profile_path = REPO / "planner" / "profiles" / "tiny_2cpu_served.json"
    model = fit_perf_model(load_profile(profile_path)).model
    run = tmp_path / "runs" / "trace" / "logs" / "steps"
    run.mkdir(parents=True)
    lines, t = [",".join(STEP_COLUMNS)], 100.0
    for i in range(60):   # every step 1 ms + 0.2 ms a sequence over the model
        batch, context = 1 + i % 8, 300 * (1 + i % 8)
        duration = model.decode_step_s(batch, context) + 0.001 + 0.0002 * batch
        lines.append(f"{t:.6f},{t + duration:.9f},0,{batch},{batch},{batch},{context}")
        t += duration + 1e-4
    (run / "steps-decode-1-42.csv").write_text("\n".join(lines) + "\n")
    (run / "steps-prefill-0-43.csv").write_text(",".join(STEP_COLUMNS) + "\n")   # not a decode engine's
    out = tmp_path / "out"
    assert bench_functions("decode_step_fit.py")["main"](
        ["--profile", str(profile_path), "--traces", str(tmp_path / "runs"), "--out", str(out)]) == 0
    written = json.loads((out / "decode_step_fit.json").read_text())
    fit = written["fits"]["batch_only"]
    assert fit["per_step_s"] == pytest.approx(0.001, abs=1e-6) and fit["per_seq_s"] == pytest.approx(0.0002, abs=1e-7)
    [row] = written["files"]
    assert row["file"] == "runs/trace/logs/steps/steps-decode-1-42.csv" and row["steps"] == 60
    assert abs(row["fit_miss_ms"]) < 1e-3   # the fit charges what the steps took
    assert (out / "decode_step_fit.png").exists()
    with pytest.raises(SystemExit, match="no decode step traces"):
        bench_functions("decode_step_fit.py")["main"](["--profile", str(profile_path), "--traces", str(out)])
