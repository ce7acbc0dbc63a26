"""bench/first_request_latency.py explains itself, orders its arms ABBA and summarizes each kind's
first and second request (its runs start real clusters: a benchmark, not a test)."""

from bench_scripts import bench_functions, bench_help


def test_the_first_request_bench_explains_itself():
    shown = bench_help("first_request_latency.py")
    assert "PDSERVE_VLLM_EAGER_RANKS=0" in shown and "ABBA" in shown and "--rounds" in shown and "cold cost" in shown


def test_the_summary_takes_each_arms_medians_and_the_cold_cost_per_round():
    functions = bench_functions("first_request_latency.py")
    round_, summarize, abba = functions["Round"], functions["summarize"], functions["abba"]
    assert abba(("eager", "compiled"), 2) == ["eager", "compiled", "compiled", "eager"]
    rounds = [round_("eager", {"logprobs": [0.12, 0.10], "greedy": [0.2, 0.1]}),
              round_("compiled", {"logprobs": [4.0, 0.1], "greedy": [0.2, 0.1]}),
              round_("compiled", {"logprobs": [6.0, 0.2], "greedy": [0.3, 0.1]}),
              round_("eager", {"logprobs": [0.14, 0.10], "greedy": [0.2, 0.1]})]
    summary = summarize(rounds)
    assert list(summary) == ["eager", "compiled"]
    assert summary["compiled"]["logprobs"]["first_s"] == 5.0 and abs(summary["compiled"]["logprobs"]["second_s"] - 0.15) < 1e-9
    assert abs(summary["compiled"]["logprobs"]["cold_s"] - (3.9 + 5.8) / 2) < 1e-9
    assert abs(summary["eager"]["logprobs"]["cold_s"] - 0.03) < 1e-9
