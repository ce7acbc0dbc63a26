"""bench/prompt_cpu.py explains itself, files each thread of a cluster under its column, alternates
its groups and reads a prompt token's cost per column (its pure parts, on plain values)."""

import pytest

from bench_scripts import bench_functions, bench_help


def test_the_prompt_cpu_bench_explains_itself():
    shown = bench_help("prompt_cpu.py")
    assert "--long-prompt" in shown and "decode KV" in shown and "ABBA" in shown


def test_each_thread_goes_to_its_process_and_role():
    column_of = bench_functions("prompt_cpu.py")["column_of"]
    assert column_of("router", False, False, "event_engine") == "router"
    assert column_of("prefill", True, True, "python") == "prefill API"          # the worker's own process, every thread
    assert column_of("decode", False, False, "pdserve-kv-pull") == "decode KV"
    assert column_of("prefill", False, False, "pdserve-kv-conn") == "prefill KV"
    assert column_of("decode", False, True, "VLLM::EngineCor") == "decode engine"
    assert column_of("decode", False, False, "gloo_tcp_loop") == "decode other"


def test_groups_alternate_abba_and_a_prompt_tokens_cost_is_the_difference_over_the_lengths():
    f = bench_functions("prompt_cpu.py")
    assert f["order"](3, 128, 1433) == [128, 1433, 1433, 128, 128, 1433]
    columns = f["COLUMNS"]
    groups = [{"prompt_tokens": 128, "requests": 10, "cpu_s": {c: 0.02 for c in columns}},
              {"prompt_tokens": 1433, "requests": 10, "cpu_s": {c: 0.02 for c in columns} | {"decode KV": 0.05}},
              {"prompt_tokens": 128, "requests": 30, "cpu_s": {c: 0.06 for c in columns}}]
    short, long = f["per_request_ms"](groups, 128), f["per_request_ms"](groups, 1433)
    assert short["router"] == pytest.approx(2.0) and long["decode KV"] == pytest.approx(5.0)
    per_token = f["per_prompt_token_us"](short, long, 128, 1433)
    assert per_token["decode KV"] == pytest.approx(3000 / 1305) and per_token["router"] == pytest.approx(0.0)
    assert f["per_request_ms"](groups, 512) == {}
