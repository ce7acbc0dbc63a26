"""The simulator places requests with the router's own policy, in the three topologies, with the
round-number model of planner_testkit (prefill step 0.1 + 0.001*tokens + 1e-6*units, decode step
0.01 + 0.005*batch + 1e-4*context, transfer 5 ms + 10 ms per 10-token block)."""

from __future__ import annotations

import dataclasses

import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from planner.perf_model import PrefillCoeffs
from planner.serving_costs import ServingCosts
from planner.simulator import RouterSettings, SimulationError, Topology, cost_model_from, simulate
from router.policies.placement import PlacementConfig

EXACT = dict(abs=1e-12)
# a long prompt, then a short one while it is still prefilling
LONG_THEN_SHORT = [spec(0.0, 800, 2), spec(0.01, 20, 2)]


def test_hybrid_computes_a_short_prompt_behind_a_long_prefill_queue_on_the_decode_instance():
    # the cap keeps the long prompt off the decode instance; the short one skips the prefill queue
    result = simulate(LONG_THEN_SHORT, Topology.hybrid(1, 1, local_prefill_max_tokens=256), round_settings(),
                      ROUND_MODEL)
    assert result.local_prefill.tolist() == [False, True]
    t = result.timeline
    # the decode instance is idle: R1's 20 tokens in one step, 0.1 + 0.02 + 0.0004, from 0.01
    assert t["first_token_s"][1] == pytest.approx(0.1304, **EXACT)
    assert t["transfer_start_s"][1] == t["transfer_end_s"][1] == t["first_token_s"][1]  # no KV moved
    # then one decode step alone: 0.01 + 0.005 + 1e-4 * 21
    assert t["finish_s"][1] == pytest.approx(0.1304 + 0.0171, **EXACT)
    assert t["first_token_s"][0] > 1.0  # the long prompt stays on the prefill instance


def test_disaggregated_never_computes_a_prompt_on_a_decode_instance():
    result = simulate(LONG_THEN_SHORT, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    assert result.local_prefill.tolist() == [False, False]
    t = result.timeline
    assert t["first_token_s"][1] >= t["first_token_s"][0]  # FCFS behind the long prompt


def test_hybrid_without_a_cap_lets_the_placement_choose_either_path():
    # idle, the decode instance computing 800 tokens beats moving their KV (0.805 s over this link);
    # the short prompt then finds the prefill instance idle and the decode instance busy
    result = simulate(LONG_THEN_SHORT, Topology.hybrid(1, 1), round_settings(), ROUND_MODEL)
    assert result.local_prefill.tolist() == [True, False]


def test_hybrid_local_prefill_cap_keeps_longer_prompts_on_the_prefill_pool():
    capped = simulate(LONG_THEN_SHORT, Topology.hybrid(1, 1, local_prefill_max_tokens=16), round_settings(),
                      ROUND_MODEL)
    assert capped.local_prefill.tolist() == [False, False]
    assert Topology.hybrid(1, 2, 256).label == "1P+2H/256" and Topology.hybrid(1, 2).label == "1P+2H"


def test_a_smaller_token_budget_trades_the_long_prompts_ttft_for_the_running_decodes_longest_gap():
    # one instance: a short request decoding 30 tokens when a 400-token prompt arrives; its chunks of
    # 100 tokens (the settings' budget) or 50 share the decode's steps. Halving the chunk shortens the
    # decode's longest gap; the prompt pays a step's fixed cost (0.1 s here) per extra chunk, and so
    # does the decode's mean (TPOT): which way a budget goes is the search's to find.
    requests = [spec(0.0, 10, 30), spec(0.05, 400, 1)]
    own = simulate(requests, Topology.aggregated(1), round_settings(), ROUND_MODEL)
    small = simulate(requests, Topology.aggregated(1, token_budget=50), round_settings(), ROUND_MODEL)
    assert small.itl_s.max() < own.itl_s.max()
    assert small.ttft_s[1] > own.ttft_s[1] and small.tpot_s[0] > own.tpot_s[0]
    same = simulate(requests, Topology.aggregated(1, token_budget=100), round_settings(), ROUND_MODEL)
    assert same.ttft_s.tolist() == own.ttft_s.tolist() and same.itl_s.tolist() == own.itl_s.tolist()


def test_aggregated_spreads_requests_over_its_instances():
    requests = [spec(0.000, 50, 3), spec(0.001, 50, 3), spec(0.002, 50, 3), spec(0.003, 50, 3)]
    result = simulate(requests, Topology.aggregated(2), round_settings(), ROUND_MODEL)
    assert result.decode_instance.tolist() == [0, 1, 0, 1]
    assert result.local_prefill.all()
    # each instance computes its first prompt alone: 0.1 + 0.05 + 0.0025
    assert result.timeline["first_token_s"][:2].tolist() == pytest.approx([0.1525, 0.1535], **EXACT)
    busy = result.busy_s["colocated"]
    assert busy[0] == pytest.approx(busy[1], rel=0.01)


def test_dispatch_gate_holds_prompts_in_the_router_and_sends_the_shortest_first():
    requests = [spec(0.0, 80, 1), spec(0.01, 60, 1), spec(0.02, 10, 1)]
    gated = dataclasses.replace(round_settings(),
                                router=RouterSettings(PlacementConfig(max_queued_prefill_tokens_per_worker=1)))
    result = simulate(requests, Topology.disaggregated(1, 1), gated, ROUND_MODEL)
    # R0 alone (0.1864); then R2 (shorter) alone: 0.1 + 0.01 + 0.0001; then R1: 0.1 + 0.06 + 0.0036
    assert result.timeline["first_token_s"].tolist() == pytest.approx([0.1864, 0.4601, 0.2965], **EXACT)
    open_gate = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    # without a gate R1 and R2 reach the prefill queue at once and share its next step
    assert open_gate.timeline["first_token_s"].tolist() == pytest.approx([0.1864, 0.3601, 0.3601], **EXACT)


def test_a_gated_long_prompt_does_not_hold_back_a_later_short_one_that_can_run_locally():
    # R0 (800) fills the prefill instance's gate; R1 (300, over the cap) waits ahead of R2 in the
    # router's queue (it arrived 0.59 s earlier); R2 (200) goes Local at once
    requests = [spec(0.0, 800, 2), spec(0.01, 300, 2), spec(0.6, 200, 2)]
    settings = round_settings(num_kv_blocks=200, router=RouterSettings(
        PlacementConfig(max_queued_prefill_tokens_per_worker=100)))
    result = simulate(requests, Topology.hybrid(1, 1, local_prefill_max_tokens=256), settings, ROUND_MODEL)
    assert result.local_prefill.tolist() == [False, False, True]
    # R0: 8 chunks of 100, sum of 0.2 + 0.02k - 0.01 = 2.24; R1 goes when R0's first token is back:
    # 3 chunks, 0.69 s; R2: two chunks on the idle decode instance from 0.6, 0.21 + 0.23
    assert result.timeline["first_token_s"].tolist() == pytest.approx([2.24, 2.93, 1.04], **EXACT)


def test_each_chunk_of_a_prompt_pays_for_its_queries_over_the_chunks_before_it():
    model = dataclasses.replace(ROUND_MODEL, prefill=PrefillCoeffs(step_s=0.1, per_token_s=0.001, per_token2_s=1e-6,
                                                                   per_prior_unit_s=1e-6))
    for topology in (Topology.disaggregated(1, 1), Topology.aggregated(1)):
        result = simulate([spec(0.0, 250, 2)], topology, round_settings(), model)
        # chunks [0, 100), [100, 200), [200, 250): 3 steps, attention 250^2, prior 100*100 + 50*200
        assert result.timeline["first_token_s"][0] == pytest.approx(3 * 0.1 + 0.25 + 0.0625 + 0.02, **EXACT)


def test_the_placement_pair_fixes_the_decode_instance_unless_picked_again_at_handoff():
    requests = [spec(0.0, 20, 2), spec(0.0, 20, 2)]
    # the router places both at once: neither decode instance runs anything yet, ties go to decode-0
    at_dispatch = simulate(requests, Topology.disaggregated(1, 2), round_settings(), ROUND_MODEL)
    assert at_dispatch.decode_instance.tolist() == [0, 0]
    at_handoff = simulate(requests, Topology.disaggregated(1, 2), round_settings(decode_pick="handoff"), ROUND_MODEL)
    assert at_handoff.decode_instance.tolist() == [0, 1]


def test_cost_model_from_maps_the_performance_model_coefficients():
    serving = ServingCosts(first_token_s=0.03, handoff_s=0.002, decode_step_s=0.003, decode_cpu_s_per_token=0.0004,
                           prefill_cpu_s_per_request=0.002, prefill_cpu_s_per_prompt_token=1e-5)
    cost = cost_model_from(ROUND_MODEL, round_settings(serving=serving), mean_prompt_tokens=150,
                           mean_output_tokens=11)
    per_seq_s = 0.005 + 1e-4 * (150 + 5.5) + 0.0004
    assert dataclasses.asdict(cost) == pytest.approx(dict(
        # the served first token, the prefill worker's CPU on the way: the router waits them
        fixed_s=0.1 + 0.03 + 0.002, per_token_s=0.001 + 1e-5, per_token2_s=1e-6,
        step_fixed_s=0.01 + 0.003, step_per_seq_s=per_seq_s,
        transfer_fixed_s=0.005 + 0.002, transfer_per_token_s=100 / 1e5,
        # 150 tokens are 2 chunks of the 100-token budget: 2 * 0.1 + 0.15 + 0.0225 alone
        local_interference_per_decode=2 * per_seq_s / 0.3725,
        # the prefill's chunks: each after the first one step's overhead more
        chunk_tokens=100, per_chunk_s=0.1, per_prior_unit_s=0.0), **EXACT)


@pytest.mark.parametrize("prompt_tokens", [1, 100, 101, 150, 1000, 1050])
def test_the_routers_prefill_is_the_models_chunked_prompt_plus_what_serving_adds(prompt_tokens):
    model = dataclasses.replace(ROUND_MODEL, prefill=PrefillCoeffs(step_s=0.1, per_token_s=0.001, per_token2_s=1e-6,
                                                                   per_prior_unit_s=3e-7))
    serving = ServingCosts(first_token_s=0.03, prefill_cpu_s_per_request=0.002, prefill_cpu_s_per_prompt_token=1e-5)
    cost = cost_model_from(model, round_settings(serving=serving), mean_prompt_tokens=150, mean_output_tokens=11)
    assert cost.prefill_s(prompt_tokens) == pytest.approx(
        model.prefill_s(prompt_tokens, 100) + 0.03 + 0.002 + 1e-5 * prompt_tokens, **EXACT)


def test_cost_model_from_refuses_an_unmeasured_transport():
    with pytest.raises(KeyError, match="'shm' is not in the profile"):
        cost_model_from(ROUND_MODEL, round_settings(transport="shm"), 100, 10)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_prefill=1, num_decode=1, kind="aggregated"), "K>=1 colocated"),
    (dict(num_colocated=2, kind="hybrid"), "N>=1 prefill"),
    (dict(num_prefill=1, num_decode=1, local_prefill_max_tokens=256), "only a hybrid topology caps"),
    (dict(num_prefill=1, num_decode=1, devices_per_instance=2), "only aggregated workers may span devices"),
    (dict(num_colocated=1, kind="aggregated", devices_per_instance=0), "devices_per_instance must be an int >= 1"),
])
def test_topology_refuses_a_shape_its_kind_cannot_have(kwargs, message):
    with pytest.raises(SimulationError, match=message):
        Topology(**kwargs)


@pytest.mark.parametrize("topology", [Topology.aggregated(2), Topology.disaggregated(1, 3), Topology.hybrid(2, 1),
                                      Topology.hybrid(1, 2, 512), Topology.aggregated(2, token_budget=512),
                                      Topology.hybrid(1, 1, 256, token_budget=1024),
                                      Topology.disaggregated(1, 1, token_budget=256),
                                      Topology.aggregated(1, devices_per_instance=2),
                                      Topology.aggregated(2, token_budget=512, devices_per_instance=4)])
def test_a_label_names_its_topology_back(topology):
    assert Topology.from_label(topology.label) == topology


@pytest.mark.parametrize("label", ["", "2", "1P", "1P+1X", "0C", "1P+0D", "1P+1D/512", "P+1D", "1p+1d", "2C@",
                                   "2C@x", "2C/512", "@512", "1Cx", "1Dx2", "1P+1Dx2", "1Cx0"])
def test_what_is_not_a_topology_label_is_refused(label):
    with pytest.raises(SimulationError):
        Topology.from_label(label)


WIDE_MODEL = dataclasses.replace(  # one engine over two devices: prefill twice as fast, decode steps 20% faster
    ROUND_MODEL, prefill=dataclasses.replace(ROUND_MODEL.prefill, per_token_s=0.0005, per_token2_s=5e-7),
    decode=dataclasses.replace(ROUND_MODEL.decode, step_s=0.008, per_seq_s=0.004))
TWO_WIDTHS = dataclasses.replace(ROUND_MODEL, wide=((2, WIDE_MODEL),))


def test_a_wide_instance_computes_with_its_widths_model_and_counts_all_its_devices():
    # one 400-token prompt alone: 0.1 + 400 x 0.001 + 400^2 x 1e-6 = 0.66 s on one device (4 chunks of
    # 100: 4 x 0.1 + 0.4 + 0.16 = 0.96 s), 4 x 0.1 + 0.2 + 0.08 = 0.68 s on the wide engine
    requests = [spec(0.0, 400, 1)]
    narrow = simulate(requests, Topology.aggregated(1), round_settings(), TWO_WIDTHS)
    wide_topology = Topology.aggregated(1, devices_per_instance=2)
    wide = simulate(requests, wide_topology, round_settings(), TWO_WIDTHS)
    assert narrow.ttft_s[0] == pytest.approx(0.96, **EXACT) and wide.ttft_s[0] == pytest.approx(0.68, **EXACT)
    assert wide_topology.devices == 2 and wide_topology.label == "1Cx2"


def test_a_wide_instance_holds_the_kv_of_all_its_devices():
    # 150 blocks of 10 tokens: more than one device's 100 blocks, within two devices' 200
    requests = [spec(0.0, 1400, 100)]
    with pytest.raises(SimulationError, match="holds 100"):
        simulate(requests, Topology.aggregated(1), round_settings(token_budget=2000), TWO_WIDTHS)
    result = simulate(requests, Topology.aggregated(1, devices_per_instance=2), round_settings(token_budget=2000),
                      TWO_WIDTHS)
    assert result.ttft_s[0] > 0


def test_a_width_the_profile_did_not_measure_is_refused():
    with pytest.raises(KeyError, match=r"no engine over 2 devices was profiled \(measured widths: \[1\]\)"):
        simulate([spec(0.0, 10, 2)], Topology.aggregated(1, devices_per_instance=2), round_settings(), ROUND_MODEL)


@pytest.mark.parametrize("kind", ["decode", "hybrid"])
def test_a_request_handed_over_mid_step_starts_its_pull_when_the_step_ends(kind):
    """vLLM's engine core takes a new request between steps and schedules its pull into the next
    one: handed over while a step runs, the pull waits for that step's end; to an idle engine, it
    starts at once."""
    from planner.simulator.hybrid import HybridInstance
    from planner.simulator.instances import DecodeInstance
    from planner.simulator.state import ItlLog, SimRequest

    settings = round_settings()
    instance = (DecodeInstance if kind == "decode" else HybridInstance)(0, settings, ROUND_MODEL, ItlLog())
    first, second = SimRequest(0, 0.0, 20, 4), SimRequest(1, 0.0, 20, 4)
    assert instance.receive(first, 1.0) == [first] and first.transfer_start_s == 1.0  # idle: at once
    instance.transfer_done(first)
    step_end_s = instance.start_step(first.transfer_end_s)
    assert step_end_s is not None
    assert instance.receive(second, first.transfer_end_s + 0.001) == []  # a step runs: not yet
    assert second.transfer_start_s is None
    assert instance.finish_step(step_end_s).transfers == [second] and second.transfer_start_s == step_end_s
