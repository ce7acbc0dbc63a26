"""The unbound processes' CPU of a validation run against the profile's charge for the same traffic."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from planner.serving_costs import ServingCosts
from planner.validation_cpu import (CoreLoad, Traffic, charged_unbound_cores, check_line, core_line, core_loads,
                                   traffic_of, unbound_cpu_check)


def test_the_charge_is_the_profiles_terms_times_the_traffic_over_its_seconds():
    serving = replace(ServingCosts(), router_cpu_s_per_request=0.004, router_cpu_s_per_prompt_token=1e-6,
                      router_cpu_s_per_token=200e-6, router_cpu_s_per_step=100e-6,
                      host_cpu_s_per_request=0.006, host_cpu_s_per_prompt_token=2e-6,
                      host_cpu_s_per_token=350e-6, host_cpu_s_per_step=150e-6)
    # 100 requests of 128 prompt tokens, 20,000 tokens in 2,000 steps, over 10 s
    traffic = Traffic(seconds=10.0, requests=100, prompt_tokens=12_800, tokens=20_000, decode_steps=2_000)
    charged = charged_unbound_cores(serving, traffic)
    router = (0.4 + 0.0128 + 4.0 + 0.2) / 10
    assert charged["router"] == pytest.approx(router)
    assert charged["client"] == pytest.approx((0.6 + 0.0256 + 7.0 + 0.3) / 10 - router)
    # not traced: no steps, the per-step term left out
    assert charged_unbound_cores(serving, replace(traffic, decode_steps=0))["router"] == pytest.approx(router - 0.02)


def test_the_check_sets_each_group_measured_beside_charged_and_says_the_ratio():
    serving = replace(ServingCosts(), router_cpu_s_per_token=200e-6, host_cpu_s_per_token=300e-6)
    traffic = Traffic(seconds=10.0, requests=10, prompt_tokens=0, tokens=10_000)
    check = unbound_cpu_check({"router": 0.1, "client": 0.05, "decode": 0.9}, serving, traffic)
    assert check == {"router": {"measured_cores": 0.1, "charged_cores": 0.2, "measured_us_per_token": 100.0},
                     "client": {"measured_cores": 0.05, "charged_cores": 0.1, "measured_us_per_token": 50.0}}
    line = check_line(4.5, check)
    assert line.startswith("4.5 req/s, unbound CPU: router 0.10 cores (the profile charges 0.20, 2.00x, 100 us a token)")


def test_the_traffic_counts_the_requests_that_finished_and_the_traced_decode_steps():
    records = [SimpleNamespace(ok=True, prompt_tokens=100, output_tokens=50),
               SimpleNamespace(ok=False, prompt_tokens=100, output_tokens=3),
               SimpleNamespace(ok=True, prompt_tokens=20, output_tokens=10)]
    steps = {"workers": {"decode-1": {"steps": 40}, "decode-2": {"steps": 2}}, "prefill_workers": {}}
    assert traffic_of(records, 3.0, steps) == Traffic(3.0, 2, 120, 60, 42)
    assert traffic_of(records, 3.0) == Traffic(3.0, 2, 120, 60, 0)


def test_a_workers_cores_split_into_its_own_load_and_the_others():
    loads = core_loads({0: 0.74, 1: 0.99, 2: 0.1}, {"prefill-0": (0,), "decode-1": (1,)},
                       {"prefill-0": 0.12, "decode-1": 0.85})
    assert [(row.worker, row.cores) for row in loads] == [("decode-1", (1,)), ("prefill-0", (0,))]
    assert loads[0].others == pytest.approx(0.14) and loads[1].others == pytest.approx(0.62)
    assert CoreLoad("w", (0,), busy=0.5, own=0.51).others == 0.0   # readings a tick apart: never below 0


def test_a_worker_over_two_cores_sums_them_and_shared_or_unmeasured_cores_are_left_out():
    loads = core_loads({0: 0.6, 1: 0.9, 2: 0.5}, {"colocated-0": (1, 0), "a": (2,), "b": (2,), "c": (3,)},
                       {"colocated-0": 1.2, "a": 0.1, "b": 0.1, "c": 0.0})
    assert [(row.worker, row.cores, row.busy) for row in loads] == [("colocated-0", (0, 1), pytest.approx(1.5))]
    assert core_loads({0: 0.5}, {"prefill-0": (0,)}, {}) == []   # its own load not read


def test_the_core_line_says_each_workers_busy_own_and_others():
    line = core_line(7.5, [CoreLoad("decode-1", (1,), 0.99, 0.85), CoreLoad("w", (2, 3), 1.5, 1.4)])
    assert line == ("7.5 req/s, the workers' cores: decode-1's core 1 0.99 busy: its own 0.85, others 0.14; "
                    "w's cores 2,3 1.50 busy: its own 1.40, others 0.10")
