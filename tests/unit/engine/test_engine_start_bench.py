"""bench/engine_start_ab.py explains itself, orders its rounds ABBA and summarizes them (its runs
start real clusters: a benchmark, not a test)."""

from bench_scripts import bench_functions, bench_help


def test_the_engine_start_bench_explains_itself():
    shown = bench_help("engine_start_ab.py")
    assert "--vllm-engine-start" in shown and "ABBA" in shown and "--rounds" in shown and "identical" in shown


def test_rounds_alternate_abba_so_drift_falls_on_both_methods():
    abba = bench_functions("engine_start_ab.py")["abba"]
    assert abba(("fork", "spawn"), 4) == ["fork", "spawn", "spawn", "fork", "fork", "spawn", "spawn", "fork"]
    assert abba(("fork", "spawn"), 1) == ["fork", "spawn"]


def test_the_summary_takes_medians_per_method_ratios_fork_over_spawn_and_checks_the_tokens():
    functions = bench_functions("engine_start_ab.py")
    round_, summarize = functions["Round"], functions["summarize"]
    rounds = [round_("fork", 30.0, {"prefill": 12.0, "decode": 14.0}, [0.10, 0.12], [0.010, 0.012], [[1, 2]], {}, {}),
              round_("spawn", 60.0, {"prefill": 22.0, "decode": 26.0}, [0.11, 0.13], [0.010, 0.012], [[1, 2]], {}, {}),
              round_("spawn", 50.0, {"prefill": 24.0, "decode": 24.0}, [0.11, 0.13], [0.010, 0.012], [[1, 2]], {}, {})]
    summary = summarize(rounds)
    assert summary["per_method"]["fork"] == {"rounds": 1, "start_s": 30.0, "start_cpu_s_per_worker": 13.0,
                                             "ttft_ms": 110.0, "tpot_ms": 11.0}
    assert summary["per_method"]["spawn"]["start_s"] == 55.0 and summary["per_method"]["spawn"]["start_cpu_s_per_worker"] == 24.0
    assert abs(summary["fork_over_spawn"]["start_s"] - 30 / 55) < 1e-9
    assert abs(summary["fork_over_spawn"]["ttft_ms"] - 110 / 120) < 1e-9
    assert summary["same_tokens"]
    rounds.append(round_("fork", 30.0, {"prefill": 12.0}, [0.1], [0.01], [[1, 3]], {}, {}))
    assert not summarize(rounds)["same_tokens"]
