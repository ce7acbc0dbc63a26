"""bench/engine_core_cpu.py explains itself, and pools each way's CPU per request net of idle (its
runs start a real cluster and engine: a benchmark, not a test)."""

import pytest

from bench_scripts import bench_functions, bench_help


def test_the_engine_core_bench_explains_itself():
    shown = bench_help("engine_core_cpu.py")
    assert "engine-core process" in shown and "--prompt-tokens" in shown and "ABBA" in shown and "--hold-wait-ms" in shown


def test_cpu_per_request_pools_the_groups_of_a_way_and_length_net_of_idle():
    functions = bench_functions("engine_core_cpu.py")
    group, pooled_of, extra_of = functions["Group"], functions["per_request_ms"], functions["extra_ms"]
    label = functions["cluster_label"]
    assert label(None) == "cluster" and label(20.0) == "cluster, hold wait 20 ms"
    groups = [group("alone", 32, 10, 3.0, {"engine core": 0.10}, [0.01] * 10),
              group("alone", 32, 10, 3.0, {"engine core": 0.12}, [0.01] * 10),
              group("cluster", 32, 10, 4.0, {"prefill engine core": 0.16, "router": 0.05}, [0.02] * 10),
              group("alone", 512, 5, 5.0, {"engine core": 0.50}, [0.1] * 5)]
    idle = {"alone": {"engine core": 0.001}, "cluster": {"prefill engine core": 0.0025}}
    pooled = pooled_of(groups, idle)
    # (0.10 + 0.12 - 0.001 x 6 s) / 20 requests = 10.7 ms; (0.16 - 0.0025 x 4 s) / 10 = 15 ms
    assert pooled[("alone", 32)]["engine core"] == pytest.approx(10.7)
    assert pooled[("cluster", 32)] == pytest.approx({"prefill engine core": 15.0, "router": 5.0})
    assert pooled[("alone", 512)]["engine core"] == pytest.approx(99.0)
    assert extra_of(pooled, 32, "cluster") == pytest.approx(4.3)
    with pytest.raises(KeyError):
        extra_of(pooled, 512, "cluster")   # no cluster group of that length: nothing to compare
