"""How a goodput comparison's systems are modelled, and its runs' requests rebuilt, with plain values."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loadgen.metrics import SLO
from planner.goodput_replay import modelled_system, run_speed_factor, sent_requests, settings_for, simulated
from planner.profile import HardwareInfo
from planner.router_config import PlannedCluster
from planner.simulator import Topology, simulate
from tests.unit.planner.planner_testkit import ROUND_MODEL, round_settings, spec

TIGHT = SLO(ttft_s=3.0, tpot_s=0.035)
LOOSE = SLO(ttft_s=3.0, tpot_s=0.070)


def test_each_system_is_the_topology_it_runs_on_two_cores():
    plan = PlannedCluster(Topology.aggregated(2, 512), LOOSE, 2.3, 0.9, "total", "trace", Path("plans/loose"))
    assert modelled_system("A", TIGHT, {}).topology == Topology.aggregated(1, devices_per_instance=2)
    assert not modelled_system("A", TIGHT, {}).routed
    assert modelled_system("A-512", TIGHT, {}).topology == Topology.aggregated(1, 512, devices_per_instance=2)
    b = modelled_system("B", TIGHT, {})
    assert b.topology == Topology.disaggregated(1, 1) and b.router_slo is None and b.routed
    agg = modelled_system("B-agg", TIGHT, {})
    assert agg.topology == Topology.aggregated(1, devices_per_instance=2) and agg.router_slo == TIGHT
    assert modelled_system("B-hybrid", TIGHT, {}).topology == Topology.hybrid(1, 1)
    star = modelled_system("B*-loose", TIGHT, {"loose": plan})
    assert (star.topology, star.router_slo, star.router_dir) == (Topology.aggregated(2, 512), LOOSE, Path("plans/loose"))
    assert modelled_system("C", TIGHT, {}) is None
    assert modelled_system("B*-tight", TIGHT, {"loose": plan}) is None  # no plan for that pair


def test_a_run_is_replayed_at_its_send_times_with_the_lengths_it_asked_for():
    specs = [spec(0.0, 100, 8), spec(1.0, 200, 4)]
    record = {"sent_s": [5.25, 6.75], "prompt_tokens": [100, 200], "output_tokens": [8, 0]}  # the second refused
    sent = sent_requests(specs, record)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in sent] == [(0.0, 100, 8), (1.5, 200, 4)]
    with pytest.raises(ValueError, match="not the workload's"):
        sent_requests(specs, record | {"prompt_tokens": [100, 201]})


def test_a_server_without_a_router_takes_every_request_in_arrival_order():
    # six 1,000-token prompts, then a 10-token one: the router's gate (4,096 queued tokens) holds the
    # sixth long prompt and the short one, and sends the short one first when the gate opens;
    # vLLM's server queues it behind all six
    requests = [spec(0.01 * i, 1000, 4) for i in range(6)] + [spec(0.07, 10, 4)]
    settings = round_settings(token_budget=100, num_kv_blocks=1000)
    wide = replace(ROUND_MODEL, wide=((2, ROUND_MODEL),))
    server = modelled_system("A", TIGHT, {})
    plain = settings_for(server, settings)
    assert not plain.router.admission and plain.router.placement.max_queued_prefill_tokens_per_worker == 0
    behind = simulate(requests, server.topology, plain, wide).ttft_s[-1]
    routed = simulate(requests, server.topology, settings, wide).ttft_s[-1]
    assert routed < behind
    b_slo = modelled_system("B-slo", SLO(ttft_s=0.5, tpot_s=1.0), {})
    refused = simulated(requests, b_slo, settings, ROUND_MODEL, {"tight": b_slo.router_slo})["tight"]["refused"]
    assert refused > 0  # the router given an SLO refuses what it predicts late


def test_vllm_s_server_is_charged_its_own_serving_costs_when_the_profile_measured_them():
    from planner.serving_costs import ServingCosts

    pdserve_costs = ServingCosts(decode_step_s=0.001, host_cores=2, host_cpu_s_per_token=1e-4)
    vllm_costs = ServingCosts(first_token_s=0.02, decode_step_s=0.008)
    settings = round_settings(serving=pdserve_costs)
    own = modelled_system("A-512", TIGHT, {}, vllm_server=vllm_costs)
    assert settings_for(own, settings).serving == vllm_costs   # the host model (pdserve's client) is off too
    assert settings_for(modelled_system("A", TIGHT, {}), settings).serving == pdserve_costs  # not measured
    # pdserve's own systems keep pdserve's costs whatever vLLM's are
    assert modelled_system("B-agg", TIGHT, {}, vllm_server=vllm_costs).serving is None
    # a lone request: its first token 20 ms later, each later token 8 ms a step later, as charged
    wide = replace(ROUND_MODEL, wide=((2, ROUND_MODEL),))
    alone = [spec(0.0, 50, 5)]
    charged = simulate(alone, own.topology, settings_for(own, settings), wide)
    bare = simulate(alone, own.topology, settings_for(modelled_system("A-512", TIGHT, {}), round_settings()), wide)
    assert charged.ttft_s[0] - bare.ttft_s[0] == pytest.approx(0.02)
    assert charged.tpot_s[0] - bare.tpot_s[0] == pytest.approx(0.008)


def test_a_run_is_as_much_slower_than_the_profile_as_its_check_of_the_same_product_says():
    profiled = HardwareInfo("cpu", 2, machine_ms_start=2.6, machine_ms_end=2.8, machine_product="bfloat16")
    run = {"host_ms_per_product": 3.51, "host_product": "bfloat16"}
    assert run_speed_factor(run, profiled) == pytest.approx(1.3)
    # a float32 check (and every comparison before host_product, which timed float32) says nothing of bfloat16
    assert run_speed_factor({"host_ms_per_product": 0.77, "host_product": "float32"}, profiled) is None
    assert run_speed_factor({"host_ms_per_product": 0.77}, profiled) is None
    assert run_speed_factor({"host_ms_per_product": 0.77}, HardwareInfo("cpu", 2, machine_ms_start=0.7)) == \
        pytest.approx(1.1)
    # either side unchecked
    assert run_speed_factor({"host_ms_per_product": None, "host_product": "bfloat16"}, profiled) is None
    assert run_speed_factor(run, HardwareInfo("cpu", 2, machine_product="bfloat16")) is None
