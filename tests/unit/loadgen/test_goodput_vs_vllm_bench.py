"""The pure parts of bench/goodput_vs_vllm.py: run order, workload per rate, goodput and ratio per
SLO pair, config validation (no server is started)."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

from goodput_vs_vllm import BenchConfig, parse_args, prompts_for, schedule, settled, workload  # noqa: E402
from goodput_vs_vllm_report import (Measurement, SLOPair, _plot_attainment, format_goodput,  # noqa: E402
                                    goodput_rows, goodputs, quiet_runs, ratio)

from loadgen.metrics import SLO  # noqa: E402

TRACE = BENCH.parent.parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
PAIRS = (SLOPair("tight", SLO(ttft_s=1.0, tpot_s=0.03)), SLOPair("loose", SLO(ttft_s=1.0, tpot_s=0.06)))


def test_abba_order_switches_system_once_per_rate_and_measures_both_at_every_rate():
    assert schedule(3) == [("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2)]


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared Azure trace is not present")
def test_each_rate_replays_the_capped_trace_over_the_configured_span():
    config = BenchConfig(seconds_per_rate=40.0, min_requests=16, max_prompt_tokens=2000, max_output_tokens=256)
    slow, fast = workload(config, 0.25), workload(config, 1.5)
    assert (len(slow), len(fast)) == (16, 60)
    assert slow[-1].arrival_s == pytest.approx(64.0) and fast[-1].arrival_s == pytest.approx(40.0)
    assert max(s.prompt_tokens for s in fast) <= 2000 and max(s.output_tokens for s in fast) <= 256
    assert [(s.prompt_tokens, s.output_tokens) for s in fast[:16]] == [(s.prompt_tokens, s.output_tokens) for s in slow]


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


def test_quick_mode_and_flags_build_the_config():
    config = parse_args(["--quick", "--tpot-tight-ms", "25", "--rates", "0.5,1"])
    assert config.rates_rps == (0.5, 1.0) and config.tpot_tight_s == 0.025
    assert config.label == "goodput_vs_vllm_quick" and config.seconds_per_rate == 20.0
    assert [p.slo for p in config.slo_pairs] == [SLO(ttft_s=1.5, tpot_s=0.025), SLO(ttft_s=1.5, tpot_s=0.06)]
