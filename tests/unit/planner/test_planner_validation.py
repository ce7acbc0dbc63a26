"""Measured-vs-simulated comparison (planner/validation.py): the errors the validation reports."""

from __future__ import annotations

import json

import subprocess
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from planner import validation_runs
from planner.validation import (Comparison, error_table, mean_abs_errors, plot_validation, to_json, verdict,
                               verdict_table, verdicts_to_json)

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


def test_a_hybrids_local_prefill_share_is_kept_and_shown_beside_the_simulated_one():
    hybrid = [Comparison(1.0, "m", summary(100, 200, 10, 20, 1.0) | {"local_prefill_share": 0.4},
                         summary(100, 200, 10, 20, 1.0) | {"local_prefill_share": 0.1}),
              Comparison(2.0, "m", summary(100, 200, 10, 20, 1.0), summary(100, 200, 10, 20, 1.0))]  # an older run
    runs = to_json(hybrid)["runs"]
    assert runs[0]["measured"]["local_prefill_share"] == 0.4 and runs[0]["simulated"]["local_prefill_share"] == 0.1
    assert "local_prefill_share" not in runs[1]["measured"]
    console = Console(record=True, width=300)
    console.print(error_table(hybrid, "t"))
    text = console.export_text()
    assert "local prefills" in text and "40% / 10%" in text
    console = Console(record=True, width=300)
    console.print(error_table(COMPARISONS, "t"))
    assert "local prefills" not in console.export_text()   # a disaggregated run's table has no such column


def test_resimulating_an_earlier_run_replays_its_requests_against_what_it_measured(tmp_path):
    """bench/validate_planner.py --resimulate: no cluster; the kept requests go through the simulator
    with the given profile and are compared with the earlier run's measurements."""

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
    """What the validation reports as the cluster's CPU, by group: the router's tree, this process
    (the client), and each kind of worker's whole trees (its vLLM processes)."""
    from types import SimpleNamespace

    trees = {5: [5, 6], 10: [10, 11, 12], 20: [20, 21], 30: [30]}  # pid -> its tree
    cpu = {5: 64.0, 6: 128.0, 10: 1.0, 11: 2.0, 12: 4.0, 20: 8.0, 21: 16.0, 30: 32.0}
    monkeypatch.setattr(validation_runs, "process_tree", lambda pid: trees[pid])
    monkeypatch.setattr(validation_runs, "cpu_seconds", lambda pids: sum(cpu[pid] for pid in pids))
    monkeypatch.setattr(validation_runs.time, "process_time", lambda: 256.0)
    cluster = SimpleNamespace(router=SimpleNamespace(pid=5),
                              workers={"prefill-0": SimpleNamespace(pid=10), "decode-1": SimpleNamespace(pid=20),
                                       "decode-2": SimpleNamespace(pid=30)})
    assert validation_runs.cpu_by_process_s(cluster) == {"router": 192.0, "client": 256.0, "prefill": 7.0,
                                                         "decode": 56.0}
    assert validation_runs.cluster_cpu_s(cluster) == 192.0 + 256.0 + 7.0 + 56.0
    assert validation_runs.cpu_by_worker_s(cluster) == {"prefill-0": 7.0, "decode-1": 24.0, "decode-2": 32.0}
    # the workers' reading given (the validation reads it once for both): grouped, not read again
    assert validation_runs.cpu_by_process_s(cluster, {"prefill-0": 1.0, "decode-1": 2.0}) == {
        "router": 192.0, "client": 256.0, "prefill": 1.0, "decode": 2.0}


def test_a_workers_cores_are_its_process_affinity_and_a_worker_gone_is_left_out():
    from types import SimpleNamespace

    # bound before its exec, which Popen waits for: the affinity is set when it returns
    alive = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        cluster = SimpleNamespace(workers={"prefill-0": SimpleNamespace(pid=alive.pid),
                                           "decode-1": SimpleNamespace(pid=gone.pid)})
        assert validation_runs.worker_cores(cluster) == {"prefill-0": (0,)}
    finally:
        alive.kill()
        alive.wait()


CURVE = [  # measured attainment 1.0, 0.95, 0.7, 0.95 (passes again past the knee: ignored); simulated 1, 1, 0.9, 0.5
    Comparison(1.0, "m", summary(100, 200, 10, 20, 1.0), summary(110, 180, 10, 20, 1.0)),
    Comparison(2.0, "m", summary(100, 200, 10, 20, 0.95), summary(130, 200, 12, 20, 1.0)),
    Comparison(3.0, "m", summary(400, 900, 30, 60, 0.70), summary(100, 100, 10, 10, 0.9)),
    Comparison(4.0, "m", summary(100, 200, 10, 20, 0.95), summary(100, 100, 10, 10, 0.5)),
]


def test_a_verdict_averages_latency_errors_up_to_the_measured_knee_and_compares_goodputs_on_the_grid():
    v = verdict(list(reversed(CURVE)), "long-short", "1P+1D", "m")
    assert v.rates_to_knee == (1.0, 2.0)  # 3 misses the target: it and everything past it are left out
    assert v.errors_to_knee["median_ttft_ms"] == pytest.approx((0.1 + 0.3) / 2)
    assert v.errors_to_knee["p90_ttft_ms"] == pytest.approx(0.05)
    assert v.errors_to_knee["median_tpot_ms"] == pytest.approx(0.1)
    # signed: p90 TTFT 10% under then exactly right: -5%; p50 TTFT over at both rates: as the |error|
    assert v.bias_to_knee["p90_ttft_ms"] == pytest.approx(-0.05) and v.bias_to_knee["median_ttft_ms"] == pytest.approx(0.2)
    # measured: 0.95 at 2, 0.70 at 3 -> crosses 0.9 at 2.2; simulated: 0.9 at 3 passes, 0.5 at 4 -> 3.0
    assert v.measured_goodput == (pytest.approx(2.2), True) and v.simulated_goodput == (pytest.approx(3.0), True)
    assert v.goodput_error == pytest.approx(0.8 / 2.2)


def test_a_cluster_that_meets_the_target_nowhere_has_its_lowest_rate_judged_and_no_goodput_error():
    missing = [Comparison(1.0, "m", summary(100, 200, 10, 20, 0.5), summary(100, 200, 10, 20, 0.95)),
               Comparison(2.0, "m", summary(100, 200, 10, 20, 0.2), summary(100, 200, 10, 20, 0.8))]
    v = verdict(missing, "bursty", "2C", "m")
    assert v.rates_to_knee == (1.0,) and v.measured_goodput == (0.0, False) and v.goodput_error is None
    row = verdicts_to_json([v])[0]
    assert row["goodput_error"] is None and row["goodput_rps"]["simulated_bracketed"] is True
    with pytest.raises(ValueError, match="no comparison"):
        verdict(missing, "bursty", "2C", "other")
    Console(width=250, record=True).print(verdict_table([v], {("bursty", "2C"): (1.0, 2.0)}))


def test_a_validation_keeps_its_topology_and_router_so_a_resimulation_places_as_the_real_router_did(tmp_path):
    from loadgen.metrics import SLO
    from loadgen.workload import RequestSpec
    from planner.profile import load_profile
    from planner.simulator import Topology

    profile_path = REPO / "planner" / "profiles" / "tiny_2cpu_served.json"
    topology = Topology.hybrid(1, 1, 512)
    sample = [RequestSpec(0.1 * i, 300 + 10 * i, 20) for i in range(10)]
    router = validation_runs.planned_router(load_profile(profile_path), "tcp", topology, sample)
    assert router.placement.local_prefill_max_tokens == 512 and not router.admission
    assert router.cost is not None and router.cost.per_token_s > 0
    setup = validation_runs.ValidationSetup("tiny", SLO(ttft_s=0.2, tpot_s=0.02), {"shape": "long-short"}, "tcp",
                                            topology, router)
    steps = {"client_steady_gap_ms": 4.3, "workers": {"decode-1": {"cycle_ms": 4.35}}}   # --step-trace's report
    loads = [{"worker": "decode-1", "cores": [1], "busy": 0.99, "own": 0.85, "others": 0.14}]
    runs = [validation_runs.RateRun(1.0, sample, summary(20, 30, 4, 5, 1.0) | {"engine_steps": steps}, None,
                                    core_loads=loads),
            validation_runs.RateRun(2.0, sample, summary(20, 30, 4, 5, 1.0), None)]
    comparisons = validation_runs.compare(runs, [profile_path], "tcp", setup.slo, topology, router)
    validation_runs.write_validation(tmp_path, setup, [profile_path], runs, comparisons)

    assert json.loads((tmp_path / "validation.json").read_text())["engine_steps"] == {"1.0": steps}
    again, runs_again = validation_runs.load_earlier(tmp_path / "validation.json", default_transport="torch")
    assert [run.core_loads for run in runs_again] == [loads, None]
    assert again.topology == topology and again.router == router and again.workload == {"shape": "long-short"}
    flags = validation_runs.router_flags_for(router, tmp_path / "router")
    assert flags[0] == "--cost-model" and flags[2] == "--placement-config" and "--slo-ttft-ms" not in flags


def test_a_run_sends_its_duration_of_arrivals_and_says_how_long_slow_rates_take():
    from planner.validation_runs import arrival_minutes, requests_at

    assert requests_at(2.0, 30, 30) == 60 and requests_at(0.5, 30, 30) == 30
    # 30 requests at 0.025 req/s are 20 minutes of arrivals alone (the bench model's long prompts)
    assert arrival_minutes([0.025], 30, 30) == pytest.approx(20.0)
    assert arrival_minutes([1.0, 2.0], 30, 30) == pytest.approx(1.0)


def test_rates_whose_runs_would_outlast_an_hour_are_refused():
    from planner.validation_runs import NoRateMeetsSlos, rates_within_budget

    assert rates_within_budget([1.0, 2.0, 3.0, 4.0], 30, 30, "1P+1D") == [1.0, 2.0, 3.0, 4.0]
    # the bench model's trace on a slow VM: 30 requests at each of 0.004-0.017 req/s
    with pytest.raises(NoRateMeetsSlos, match="255 min of arrivals"):
        rates_within_budget([0.004, 0.008, 0.013, 0.017], 30, 30, "1P+1D")
    assert rates_within_budget([0.025, 0.05], 30, 30, "1P+1D") == [0.025, 0.05]   # 30 minutes: run


def test_a_what_if_placement_nets_the_profiles_served_step_again_or_says_why_it_cannot():
    from dataclasses import replace

    from planner.profile import load_profile

    kept = REPO / "bench" / "results" / "client_share_amx167" / "tiny_2cpu_amx167_served.json"
    profile = load_profile(kept)   # netted with "router-room", its batched runs kept
    assert validation_runs.with_client_placement(profile, None) == (profile, "")
    assert validation_runs.with_client_placement(profile, "router-room") == (profile, "")
    woken, why = validation_runs.with_client_placement(profile, "wake")
    assert why == "" and woken.serving.client_placement == "wake"
    assert woken.serving.decode_cpu_s_per_token < profile.serving.decode_cpu_s_per_token   # the client's share out
    bare = replace(profile, serving=replace(profile.serving, served_batch_runs=()))
    same, why = validation_runs.with_client_placement(bare, "wake")
    assert same is bare and "no batched runs were kept" in why and "its own placement is kept" in why
