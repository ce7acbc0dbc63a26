"""Measured-vs-simulated comparison (planner/validation.py): the errors the validation reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from planner import validation_runs
from planner.validation import Comparison, error_table, mean_abs_errors, plot_validation, to_json

REPO = Path(__file__).resolve().parents[3]


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


def test_resimulating_an_earlier_run_replays_its_requests_against_what_it_measured(tmp_path):
    """bench/validate_planner.py --resimulate: no cluster; the kept requests go through the simulator
    with the given profile and are compared with the earlier run's measurements."""
    import json

    profile = REPO / "planner" / "profiles" / "tiny_2cpu_served.json"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    light = [[0.5 * i, 100, 20] for i in range(20)]          # 2 req/s
    heavy = [[0.01 * i, 100, 20] for i in range(200)]        # 100 req/s: queues
    measured = summary(15.0, 20.0, 3.0, 4.0, 1.0)
    (earlier / "validation.json").write_text(json.dumps({
        "model": "tiny", "profiles": ["x"], "slo_ms": {"ttft": 200.0, "tpot": 20.0}, "workload": {}, "transport": "torch",
        "runs": [{"rate_rps": 2.0, "model": "x", "measured": measured},
                 {"rate_rps": 100.0, "model": "x", "measured": measured}],
        "requests": {"2.0": light, "100.0": heavy}}))
    out = tmp_path / "out"
    setup, runs = validation_runs.load_earlier(earlier / "validation.json", default_transport="tcp")
    comparisons = validation_runs.compare(runs, [profile], setup.transport, setup.slo)
    validation_runs.write_validation(out, setup, [profile], runs, comparisons, resimulated=earlier)

    written = json.loads((out / "validation.json").read_text())
    runs = {run["rate_rps"]: run for run in written["runs"]}
    assert set(runs) == {2.0, 100.0} and written["resimulated"] == str(earlier)
    assert written["transport"] == "torch"  # the earlier run's, not the command line's default
    assert all(run["model"] == "tiny_2cpu_served" and run["measured"] == measured for run in runs.values())
    light_ttft, heavy_ttft = runs[2.0]["simulated"]["median_ttft_ms"], runs[100.0]["simulated"]["median_ttft_ms"]
    assert 0 < light_ttft < heavy_ttft  # the heavy run's requests queued behind each other
    assert runs[2.0]["error"]["median_ttft_ms"] == pytest.approx((light_ttft - 15.0) / 15.0)
    assert written["requests"]["2.0"] == light and (out / "validation.png").exists()


def test_the_validation_needs_a_model_or_an_earlier_run():
    done = subprocess.run([sys.executable, "bench/validate_planner.py", "--profile", "p.json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "give --model" in done.stderr


def test_the_cluster_cpu_counts_the_router_the_client_and_every_worker_with_its_children(monkeypatch):
    """What the validation reports as the cluster's CPU: the router's tree and this process (the
    host's processes, as the profiler counts them) and each worker's whole tree (its vLLM processes)."""
    from types import SimpleNamespace

    trees = {10: [10, 11, 12], 20: [20, 21]}  # worker pid -> its tree
    cpu = {10: 1.0, 11: 2.0, 12: 4.0, 20: 8.0, 21: 16.0}
    monkeypatch.setattr(validation_runs, "process_tree", lambda pid: trees[pid])
    monkeypatch.setattr(validation_runs, "cpu_seconds", lambda pids: sum(cpu[pid] for pid in pids))
    monkeypatch.setattr(validation_runs, "host_cpu_seconds", lambda router_pid: 100.0 * router_pid)
    cluster = SimpleNamespace(router=SimpleNamespace(pid=5),
                              workers={"prefill-0": SimpleNamespace(pid=10),
                                       "decode-1": SimpleNamespace(pid=20)})
    assert validation_runs.cluster_cpu_s(cluster) == 500.0 + 31.0
