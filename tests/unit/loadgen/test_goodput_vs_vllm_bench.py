"""The pure parts of bench/goodput_vs_vllm.py: run order, workload per rate, the time budget,
goodput and ratio per SLO pair, the report of skipped points, config validation (no server is started)."""

import io
import json
import runpy
from pathlib import Path

import pytest
from rich.console import Console

from loadgen.comparison.budget import Budget, estimate_run_s, quiet_wait_s, skip_reason
from loadgen.comparison.config import CompareConfig as BenchConfig
from loadgen.comparison.config import prompts_for, schedule, workload
from loadgen.comparison.goodput import (Measurement, Skipped, SLOPair, format_goodput, goodputs, quiet_runs, ratio,
                                        settled)
from loadgen.comparison.report import goodput_rows, report
from loadgen.comparison.report import plot_attainment as _plot_attainment
from loadgen.metrics import SLO

REPO = Path(__file__).resolve().parents[3]
TRACE = REPO.parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
PAIRS = (SLOPair("tight", SLO(ttft_s=1.0, tpot_s=0.03)), SLOPair("loose", SLO(ttft_s=1.0, tpot_s=0.06)))


def test_abba_order_switches_system_once_per_rate_and_measures_all_at_every_rate():
    assert schedule(3) == [("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2)]
    assert schedule(2, ("A", "B", "C")) == [("A", 0), ("B", 0), ("C", 0), ("C", 1), ("B", 1), ("A", 1)]
    assert BenchConfig(with_c=True).systems == ("A", "B", "C") and BenchConfig().systems == ("A", "B")


def test_pdserve_systems_name_their_transport_and_unknown_ones_are_refused():
    config = BenchConfig(pdserve_systems=("B", "B-tcp"), transport="shm")
    assert config.systems == ("A", "B", "B-tcp")
    assert config.transport_of("B") == "shm" and config.transport_of("B-tcp") == "tcp"
    assert BenchConfig().transport_of("B") == "auto"
    with pytest.raises(ValueError, match="among B, B-tcp, B-hybrid, B-agg"):
        BenchConfig(pdserve_systems=("B", "D"))


def test_the_slo_driven_systems_place_by_the_tight_slos_and_the_others_run_without():
    config = BenchConfig(pdserve_systems=("B", "B-hybrid", "B-agg"), ttft_slo_s=1.5, tpot_tight_s=0.03)
    assert [config.topology_of(s) for s in config.pdserve_systems] == ["disaggregated", "hybrid", "aggregated"]
    assert config.router_flags_of("B") == ()
    assert config.router_flags_of("B-hybrid") == ("--slo-ttft-ms", "1500", "--slo-tpot-ms", "30")


def test_the_phase_table_gives_each_pdserve_system_and_its_producers_kv_cpu_per_mib():
    from loadgen.comparison.report import phase_rows

    def run(system, kv_cpu_s):
        phases = {"mean_prefill_ms": 400.0, "p90_prefill_ms": 900.0, "mean_kv_transfer_ms": 9.0,
                  "p90_kv_transfer_ms": 12.0, "mean_decode_ms": 1200.0, "mean_kv_transfer_bytes": 8 * 2**20,
                  "total_kv_transfer_bytes": 30 * 8 * 2**20, "p90_ttft_ms": 1100.0, "slo_attainment": 1.0}
        return Measurement(system, 1.0, None, {"tight": phases}, 0.0, False, kv_producer_cpu_s=kv_cpu_s)

    headers, rows = phase_rows([run("B-tcp", 0.48), run("B", 0.012), run("A", None)], "tight")
    assert headers[1] == "system" and headers[-2] == "producer KV CPU ms / MiB"
    assert [row[1] for row in rows] == ["B", "B-tcp"]  # A has no phases; pdserve systems sorted by name
    assert rows[0][-2] == "0.05" and rows[1][-2] == "2.00"  # 12 ms and 480 ms over 240 MiB


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared Azure trace is not present")
def test_every_rate_replays_the_same_capped_requests_retimed_to_the_rate():
    config = BenchConfig(num_requests=30, max_prompt_tokens=2000, max_output_tokens=256)
    slow, fast = workload(config, 0.25), workload(config, 1.5)
    assert len(slow) == len(fast) == 30
    assert [(s.prompt_tokens, s.output_tokens) for s in slow] == [(s.prompt_tokens, s.output_tokens) for s in fast]
    assert slow[-1].arrival_s == pytest.approx(120.0) and fast[-1].arrival_s == pytest.approx(20.0)
    assert [s.arrival_s * 0.25 for s in slow] == pytest.approx([s.arrival_s * 1.5 for s in fast])  # same shape
    assert max(s.prompt_tokens for s in fast) == 2000 and max(s.output_tokens for s in fast) <= 256


def test_the_time_budget_decides_what_still_fits():
    config = BenchConfig(num_requests=30, start_estimate_s=40.0, run_overhead_s=20.0, report_reserve_s=30.0,
                         max_quiet_wait_s=45.0)
    assert estimate_run_s(config, 0.5) == 80.0  # 60 s of arrivals + 20
    assert estimate_run_s(config, 3.0, servers_to_start=2) == 110.0  # 2 starts x 40 + 10 + 20
    assert skip_reason(config, remaining_s=110.0, need_s=80.0) is None  # 110 - 30 reserved >= 80
    assert skip_reason(config, remaining_s=100.0, need_s=80.0) == "time budget: needs ~80 s, 70 s left"
    assert quiet_wait_s(config, remaining_s=1000.0, need_s=80.0) == 45.0
    assert quiet_wait_s(config, remaining_s=120.0, need_s=80.0) == 10.0  # never into the run's own time
    assert quiet_wait_s(config, remaining_s=50.0, need_s=80.0) == 0.0
    now = [100.0]
    budget = Budget(600.0, clock=lambda: now[0])
    now[0] = 350.0
    assert budget.remaining_s() == 350.0


def test_a_report_lists_points_skipped_for_time_and_systems_never_measured(tmp_path):
    config = BenchConfig(out_dir=tmp_path, label="t", with_c=True)
    skipped = [Skipped("C", 0.25, "time budget: needs ~165 s, 40 s left")]
    report(config, [], Console(file=io.StringIO()), wall_s=60.0, argv=["bench"], skipped=skipped)
    markdown = (tmp_path / "t.md").read_text()
    assert "| 0.25 | C | time budget: needs ~165 s, 40 s left |" in markdown
    assert "1 points skipped for time" in markdown
    assert "| tight: TTFT <= 1500 ms, TPOT <= 30 ms | not measured | not measured | not measured | n/a | n/a |" in markdown
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["skipped_for_time"] == [{"system": "C", "rate_rps": 0.25, "reason": "time budget: needs ~165 s, 40 s left"}]
    # paths inside the repository are recorded relative to it, not as this machine's
    assert saved["config"]["model_dir"] == "models/bench" and saved["config"]["out_dir"] == str(tmp_path)


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared Azure trace is not present")
def test_prompts_are_shared_by_both_systems_at_a_rate_and_differ_across_rates():
    config = BenchConfig()
    spec = workload(config, 0.5)[0]
    same = prompts_for(config, 2, 8192).prompt(spec, 0), prompts_for(config, 2, 8192).prompt(spec, 0)
    assert same[0] == same[1]
    assert prompts_for(config, 3, 8192).prompt(spec, 0).token_ids != same[0].token_ids
    assert max(same[0].token_ids) < 8192 - 10


def _measurement(system, rate, tight, loose, other_cores=0.0):
    summaries = {"tight": {"slo_attainment": tight}, "loose": {"slo_attainment": loose}}
    return Measurement(system, rate, result=None, summaries=summaries, other_load_cores=other_cores, restarted=False)


def test_goodput_per_system_and_pair_and_the_b_over_a_ratio():
    runs = [_measurement("A", 0.5, 1.0, 1.0), _measurement("B", 0.5, 0.95, 1.0),
            _measurement("A", 1.0, 0.8, 0.95), _measurement("B", 1.0, 0.6, 0.7),
            _measurement("A", 1.5, 0.5, 0.7), _measurement("B", 1.5, 0.3, 0.5)]
    found = goodputs(runs, PAIRS, target=0.9)
    assert found["tight"]["A"] == (pytest.approx(0.75), True)  # 1.0 @ 0.5 -> 0.8 @ 1.0
    assert found["tight"]["B"] == (pytest.approx(0.5 + 0.5 * 0.05 / 0.35), True)
    assert found["loose"]["A"] == (pytest.approx(1.0 + 0.5 * 0.05 / 0.25), True)
    assert found["loose"]["B"] == (pytest.approx(0.5 + 0.5 * 0.1 / 0.3), True)
    headers, rows = goodput_rows(found, PAIRS, rates=(0.5, 1.0, 1.5))
    assert headers[-1] == "B / A" and rows[0][-1] == f"{(0.5 + 0.5 * 0.05 / 0.35) / 0.75:.2f}"
    with_c = goodputs(runs + [_measurement("C", 0.5, 1.0, 1.0), _measurement("C", 1.0, 0.7, 0.9)], PAIRS, 0.9)
    headers, rows = goodput_rows(with_c, PAIRS, rates=(0.5, 1.0, 1.5), systems=("A", "B", "C"))
    assert headers == ["SLO pair", "A goodput (req/s)", "B goodput (req/s)", "C goodput (req/s)", "B / A", "C / A"]
    assert rows[0][3:] == ["0.67", "0.76", "0.89"]  # C: 1.0 @ 0.5 -> 0.7 @ 1.0 crosses 0.9 at 0.667; A at 0.75
    assert rows[1][3] == ">= 1" and rows[1][-1] == "0.91 (bound)"  # C's loose curve never fell below 90%


def test_noisy_runs_are_left_out_of_the_goodput_unless_a_system_has_no_quiet_run(tmp_path):
    noisy_dip = _measurement("A", 0.75, 0.04, 0.04, other_cores=0.66)
    runs = [_measurement("A", 0.5, 1.0, 1.0), noisy_dip, _measurement("A", 1.0, 0.97, 1.0),
            _measurement("A", 1.5, 0.5, 0.5), _measurement("B", 0.5, 0.5, 0.5, other_cores=1.0)]
    assert noisy_dip not in quiet_runs(runs) and runs[-1] in quiet_runs(runs)
    found = goodputs(runs, PAIRS, target=0.9)
    assert found["tight"]["A"] == (pytest.approx(1.0 + 0.5 * 0.07 / 0.47), True)  # not 0.5-0.75: the dip is noise
    assert found["tight"]["B"] == (0.0, False)
    config = BenchConfig(out_dir=tmp_path, label="t")
    path = _plot_attainment(config, runs, PAIRS[0], found["tight"])
    assert path == tmp_path / "t_attainment_tight.png" and path.stat().st_size > 10_000


def test_a_system_is_settled_after_missing_the_target_under_loose_slos_at_n_rates():
    config = BenchConfig(stop_after_failures=2, attainment_target=0.9)
    runs = [_measurement("B", 0.5, 0.5, 0.95), _measurement("B", 1.0, 0.2, 0.8), _measurement("A", 1.0, 0.1, 0.1)]
    assert not settled(runs, "B", config)  # tight misses alone do not settle it: loose still passed at 0.5
    assert settled(runs + [_measurement("B", 1.5, 0.1, 0.4)], "B", config)
    assert not settled(runs, "A", config)
    assert not settled(runs + [_measurement("B", 1.5, 0.1, 0.4, other_cores=0.9)], "B", config)  # noisy: not counted


def test_ratio_and_goodputs_outside_the_grid_read_as_bounds():
    assert ratio(0.5, 1.0) == 0.5 and ratio(0.0, 0.0) is None and ratio(1.0, 0.0) == float("inf")
    assert format_goodput((0.0, False), (0.25, 0.5)) == "< 0.25"
    assert format_goodput((1.5, False), (0.25, 1.5)) == ">= 1.5"
    assert format_goodput((0.8123, True), (0.25, 1.5)) == "0.81"


def test_config_mistakes_say_how_to_fix_them():
    assert BenchConfig().engine_settings().enable_prefix_caching is False  # re-measured runs resend their prompts
    with pytest.raises(ValueError, match="ascending"):
        BenchConfig(rates_rps=(1.0, 0.5))
    with pytest.raises(ValueError, match="must fit max_model_len 4096"):
        BenchConfig(max_prompt_tokens=4000)
    with pytest.raises(ValueError, match="tight TPOT SLO < loose"):
        BenchConfig(tpot_tight_s=0.1, tpot_loose_s=0.05)
    with pytest.raises(ValueError, match="raise --budget-min"):
        BenchConfig(budget_s=20.0)


def parse_args(argv: list[str]) -> BenchConfig:
    """The configuration bench/goodput_vs_vllm.py builds from `argv` (the script is run, not imported)."""
    return runpy.run_path(str(REPO / "bench" / "goodput_vs_vllm.py"))["parse_args"](argv)


def test_quick_mode_and_flags_build_the_config():
    config = parse_args(["--quick", "--tpot-tight-ms", "25", "--rates", "0.5,1"])
    assert config.rates_rps == (0.5, 1.0) and config.tpot_tight_s == 0.025
    assert (config.label, config.num_requests, config.budget_s, config.with_c) == ("goodput_vs_vllm_quick", 16, 360.0, False)
    assert [p.slo for p in config.slo_pairs] == [SLO(ttft_s=1.5, tpot_s=0.025), SLO(ttft_s=1.5, tpot_s=0.06)]
    full = parse_args(["--num-requests", "24", "--budget-min", "25", "--with-c"])
    assert (full.num_requests, full.budget_s, full.with_c, full.label) == (24, 1500.0, True, "goodput_vs_vllm")
    assert parse_args([]).budget_s == 19 * 60.0


def test_a_star_is_the_best_vllm_setting_per_pair_and_pdserve_is_also_compared_with_it():
    from loadgen.comparison.goodput import best_vllm

    found = {"tight": {"A": (0.4, True), "A-512": (0.6, True), "A-1024": (0.5, True), "B": (0.9, True)},
             "loose": {"A": (1.0, True), "A-512": (0.7, True), "A-1024": (0.8, True), "B": (0.9, True)}}
    assert best_vllm(found["tight"]) == ("A-512", (0.6, True)) and best_vllm({"B": (1.0, True)}) is None
    headers, rows = goodput_rows(found, PAIRS, [0.5, 1.0], ("A", "A-512", "A-1024", "B"))
    assert headers[5] == "A* (best vLLM)" and headers[-1] == "B / A*"
    tight, loose = rows
    assert tight[5] == "0.60 (A-512)" and tight[-1] == "1.50" and tight[-2] == "2.25"  # B/A*, B/A
    assert loose[5] == "1.00 (A)" and loose[-1] == "0.90"


def test_a_systems_with_their_batched_tokens_come_from_systems():
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from goodput_vs_vllm import parse_args

    config = parse_args(["--systems", "A,A-512,A-1024,B,B-slo"])
    assert config.vllm_batched_tokens == (512, 1024) and config.pdserve_systems == ("B", "B-slo")
    assert config.systems == ("A", "A-512", "A-1024", "B", "B-slo")
    with pytest.raises(SystemExit):
        parse_args(["--systems", "A,A-big,B"])


def test_a_plan_per_slo_pair_becomes_a_b_star_system_and_its_prediction_is_set_beside_the_measured(tmp_path):
    import sys

    from loadgen.comparison.report import plan_rows
    from planner.router_config import write_planned_cluster
    from planner.simulator import Topology

    sys.path.insert(0, str(REPO / "bench"))
    from goodput_vs_vllm import parse_args, predictions

    write_planned_cluster(tmp_path / "t", Topology.aggregated(2), SLO(ttft_s=1.5, tpot_s=0.03), 2.4, 0.95, "total", "w")
    config = parse_args(["--systems", "A,B", "--plan", f"tight={tmp_path / 't'}"])
    assert config.systems == ("A", "B", "B*-tight")
    assert predictions(config) == {"B*-tight": ("tight", "2C", 2.4, "")}   # its workload names no count
    found = {"tight": {"A": (1.0, True), "B*-tight": (2.0, True)}, "loose": {}}
    headers, rows = plan_rows(found, predictions(config), [0.5, 1.0, 2.0, 3.0])
    assert rows == [["B*-tight", "tight", "2C", "2.40", "2.00", "+20%"]]
    for bad in (["--plan", f"medium={tmp_path / 't'}"], ["--plan", f"loose={tmp_path / 'missing'}"],
                ["--plan", f"loose-={tmp_path / 't'}"], ["--plan", f"tight={tmp_path / 't'}", "--plan", f"tight={tmp_path / 't'}"]):
        with pytest.raises(SystemExit):
            parse_args(bad)

    # a variant of a plan (its router files changed) runs beside it, judged under the pair it was planned for
    config = parse_args(["--systems", "A", "--plan", f"tight={tmp_path / 't'}", "--plan", f"tight-q50={tmp_path / 't'}"])
    assert config.systems == ("A", "B*-tight", "B*-tight-q50")
    assert predictions(config)["B*-tight-q50"] == ("tight", "2C", 2.4, "")
    found["tight"]["B*-tight-q50"] = (2.6, True)
    _, rows = plan_rows(found, predictions(config), [0.5, 1.0, 2.0, 3.0])
    assert ["B*-tight-q50", "tight", "2C", "2.40", "2.60", "-8%"] in rows

    # a plan made for another request set: measured beside the rest, but no error is claimed for it
    write_planned_cluster(tmp_path / "l", Topology.aggregated(2), SLO(ttft_s=1.5, tpot_s=0.06), 3.0, 0.9, "total",
                          "trace/trace, 80 requests, mean 588 prompt / 134 output tokens")
    config = parse_args(["--systems", "A", "--plan", f"loose={tmp_path / 'l'}", "--num-requests", "40"])
    assert predictions(config)["B*-loose"][3] == "planned for 80 requests, measured on 40"
    _, rows = plan_rows({"tight": {}, "loose": {"B*-loose": (2.0, True)}}, predictions(config), [1.0, 2.0, 3.0])
    assert rows == [["B*-loose", "loose", "2C", "3.00", "2.00", "n/a (planned for 80 requests, measured on 40)"]]
    config = parse_args(["--systems", "A", "--plan", f"loose={tmp_path / 'l'}", "--num-requests", "80"])
    assert predictions(config)["B*-loose"][3] == ""


def test_the_long_prompt_shape_replays_the_same_prefill_heavy_lengths_at_every_rate():
    config = BenchConfig(shape="long-prompt", num_requests=40)
    slow, fast = workload(config, 1.0), workload(config, 2.0)
    assert [(r.prompt_tokens, r.output_tokens) for r in slow] == [(r.prompt_tokens, r.output_tokens) for r in fast]
    assert all(1024 <= r.prompt_tokens <= 2048 and 16 <= r.output_tokens <= 32 for r in slow)
    with pytest.raises(ValueError, match="the workload shape must be one of trace, long-prompt"):
        BenchConfig(shape="chat")


def test_each_run_shows_the_machine_speed_it_started_on():
    from loadgen.comparison.report import machine_speed_line, per_rate_rows

    summary = {"num_prompts": 10, "completed": 10, "failed": 0, "timed_out": 0, "slo_attainment": 1.0,
               "median_ttft_ms": 100.0, "p90_ttft_ms": 200.0, "median_tpot_ms": 20.0, "p90_tpot_ms": 30.0}
    runs = [Measurement(system, rate, None, {"tight": summary, "loose": summary}, 0.0, False, host_ms_per_product=ms)
            for system, rate, ms in (("A", 1.0, 1.0), ("B", 1.0, 1.0), ("A", 2.0, 1.5), ("B", 2.0, None))]
    headers, rows = per_rate_rows(runs, PAIRS)
    speed = headers.index("machine speed")
    assert [row[speed] for row in rows] == ["x1.00", "x1.00", "x1.50", "-"]
    assert [row[headers.index("refused (by)")] for row in rows] == ["0"] * 4   # no records, no router counts
    assert "A @ 2 (x1.50)" in machine_speed_line(runs)
    with pytest.raises(ValueError, match="host_check_s must be >= 0"):
        BenchConfig(host_check_s=-1.0)
