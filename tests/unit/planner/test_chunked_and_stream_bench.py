"""bench/chunked_prefill.py and bench/stream_cpu.py: their help, and what they make of what they read."""

from __future__ import annotations

import pytest
from bench_scripts import bench_functions, bench_help

from planner.serving_costs import ServingCosts

CHUNKED = bench_functions("chunked_prefill.py")
STREAM = bench_functions("stream_cpu.py")


def test_the_help_says_what_is_measured_and_how_to_run_it():
    chunked, stream = bench_help("chunked_prefill.py"), bench_help("stream_cpu.py")
    assert "python bench/chunked_prefill.py" in chunked and "--budgets" in chunked and "one pass" in chunked
    assert "python bench/stream_cpu.py" in stream and "prefill core" in stream and "--profile" in stream


def test_the_budgets_order_rotates_with_the_round():
    order = CHUNKED["budget_order"]
    assert order((2048, 256, 1024), 0) == [2048, 256, 1024]
    assert order((2048, 256, 1024), 1) == [256, 1024, 2048]
    assert order((2048, 256, 1024), 3) == [2048, 256, 1024]


def test_each_budgets_time_is_a_median_over_rounds_against_the_one_pass_budget_and_the_model():
    rows = [{"budget": b, "prompt_tokens": n, "seconds": s}
            for b, n, s in [(2048, 1000, 1.0), (2048, 1000, 1.2), (2048, 1000, 1.1),
                            (256, 1000, 1.3), (256, 1000, 1.2), (256, 1000, 1.4), (256, 500, 0.6)]]
    summary = {(s["budget"], s["prompt_tokens"]): s for s in CHUNKED["summarize"](
        rows, 2048, predicted=lambda n, b: n / 1000 * (1.05 if b == 256 else 1.0))}
    assert summary[(256, 1000)]["seconds"] == pytest.approx(1.3) and summary[(256, 1000)]["rounds"] == 3
    assert summary[(256, 1000)]["ratio"] == pytest.approx(1.3 / 1.1)
    assert summary[(256, 1000)]["model_ratio"] == pytest.approx(1.05)
    assert summary[(256, 500)]["ratio"] is None  # no one-pass time for that length


def test_a_cores_busy_share_leaves_out_idle_and_iowait():
    before = {"cpu0": [100, 0, 50, 800, 50, 0, 0, 0]}
    after = {"cpu0": [160, 0, 70, 900, 70, 0, 0, 0]}  # 200 ticks: 80 busy, 100 idle, 20 iowait
    assert STREAM["busy_cores"](before, after) == {"cpu0": pytest.approx(0.4)}


def test_a_profile_charges_streaming_per_token_and_per_step():
    costs = ServingCosts(host_cpu_s_per_token=3e-4, router_cpu_s_per_token=2e-4, host_cpu_s_per_step=1e-3,
                         router_cpu_s_per_step=5e-4)
    charged = STREAM["charged_cores"](costs, 400.0, 8)  # 50 steps a second
    assert charged == {"router": pytest.approx(400 * 2e-4 + 50 * 5e-4), "client": pytest.approx(400 * 1e-4 + 50 * 5e-4)}
    assert STREAM["charged_cores"](ServingCosts(), 400.0, 8) == {"router": 0.0, "client": 0.0}


def test_a_served_step_is_charged_the_engine_step_plus_the_served_terms_stretched_by_the_host():
    from planner.perf_model import fit_perf_model
    from planner.profile import load_profile
    from planner.profiles.example import EXAMPLE_PROFILE_PATH

    engine = fit_perf_model(load_profile(EXAMPLE_PROFILE_PATH)).model
    engine_s = engine.decode_step_s(8, 1000)
    bare = STREAM["charged_step"](ServingCosts(), engine, 8, 1000, 400.0)
    assert bare == {"engine_s": engine_s, "served_s": engine_s, "stretch": 1.0}
    served = ServingCosts(decode_step_s=1e-3, decode_cpu_s_per_token=2e-4)
    charged = STREAM["charged_step"](served, engine, 8, 1000, 400.0)["served_s"]
    assert charged == pytest.approx(engine_s + 1e-3 + 8 * 2e-4)
    # a host of one core: the client's 0.2 core (400 tokens/s at 0.5 ms each) finds no idle core and
    # shares the stepping one, 1 / (1 - 0.2) longer
    loaded = ServingCosts(decode_step_s=1e-3, host_cores=1, host_cpu_s_per_token=5e-4)
    step = STREAM["charged_step"](loaded, engine, 8, 1000, 400.0)
    assert step["stretch"] == pytest.approx(1 / (1 - 0.2))
    assert step["served_s"] == pytest.approx((engine_s + 1e-3) / 0.8)
