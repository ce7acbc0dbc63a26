"""Serving costs around the engines (the router's hops, the workers' API processes, the host's
unbound load) in the simulator, against schedules computed by hand with planner_testkit's
round-number model (prefill step 0.1 + 0.001*tokens + 1e-6*units, decode step 0.01 + 0.005*batch
+ 1e-4*context, transfer 5 ms + 10 ms per 10-token block)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from planner.profile import ProfileError
from planner.serving_costs import ServingCosts
from planner.simulator import SimulationError, Topology, simulate
from planner.simulator.host import HostCpu, RouterBacklog, stretch_for_load, stretch_for_loads

EXACT = dict(abs=1e-12)


def test_latencies_and_worker_cpu_reproduce_a_hand_schedule():
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.003, decode_step_s=0.0002, decode_cpu_s_per_token=0.001,
                         decode_cpu_s_per_request=0.0005, prefill_cpu_s_per_request=0.002)
    result = simulate([spec(0.0, 50, 3)], Topology.disaggregated(1, 1), round_settings(serving=costs), ROUND_MODEL)
    t = result.timeline
    # prefill: 0.1 + 0.05 + 0.0025 + 0.002 (one request starts) = 0.1545
    assert t["first_token_s"].tolist() == pytest.approx([0.1545], **EXACT)
    # handoff 3 ms, then 5 blocks pulled: 0.055 s -> decoding from 0.2125
    assert t["transfer_start_s"].tolist() == pytest.approx([0.1575], **EXACT)
    assert t["transfer_end_s"].tolist() == pytest.approx([0.2125], **EXACT)
    # decode steps: 0.015 + 1e-4 * (51, 52) + 0.0002 + 0.001 per token (+ 0.0005 as it joins) -> 0.0218, 0.0214
    assert t["first_decode_token_s"].tolist() == pytest.approx([0.2343], **EXACT)
    assert t["finish_s"].tolist() == pytest.approx([0.2557], **EXACT)
    # the client sees every token 4 ms later: TTFT and E2EL grow, TPOT does not
    assert result.ttft_s.tolist() == pytest.approx([0.1585], **EXACT)
    assert result.e2el_s.tolist() == pytest.approx([0.2597], **EXACT)
    assert result.tpot_s.tolist() == pytest.approx([(0.2557 - 0.1545) / 2], **EXACT)


def test_zero_costs_leave_the_engine_schedule_exactly_as_it_was():
    requests = [spec(0.0, 50, 12), spec(0.0, 80, 2), spec(0.05, 30, 1)]
    plain = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    zeros = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=ServingCosts()), ROUND_MODEL)
    for name, values in plain.timeline.items():
        assert zeros.timeline[name].tolist() == values.tolist(), name


def test_host_load_first_fills_idle_cores_then_stretches_the_busy_ones():
    host = HostCpu(ServingCosts(host_cpu_s_per_token=0.001, host_cores=2), window_s=1.0)
    host.tokens_emitted(0.5, 600)  # 0.6 cpu-s in the last second: 0.6 cores
    assert host.load_cores(1.0) == pytest.approx(0.6, **EXACT)
    assert host.stretch(1.0, busy_cores=1) == 1.0  # one core is free and absorbs it
    assert host.stretch(1.0, busy_cores=2) == pytest.approx(1 / (1 - 0.3), **EXACT)  # 0.6 over two cores
    host.tokens_emitted(0.9, 1000)  # 1.6 cores: 0.6 spills onto the one busy core
    assert host.stretch(1.0, busy_cores=1) == pytest.approx(1 / (1 - 0.6), **EXACT)
    assert host.load_cores(1.6) == pytest.approx(1.0, **EXACT)  # the first work left the window
    assert HostCpu(ServingCosts(host_cpu_s_per_token=5.0, host_cores=2)).stretch(0.0, 2) == 1.0  # none yet


def test_an_unmodelled_host_never_stretches():
    host = HostCpu(ServingCosts(host_cpu_s_per_token=1.0, host_cores=0))
    host.tokens_emitted(0.0, 10_000)
    assert host.stretch(0.1, busy_cores=2) == 1.0


def test_host_load_lowers_the_rate_a_cluster_sustains():
    """The knee: the same workload with and without the router's per-token CPU on a 2-core host."""
    requests = [spec(i * 0.5, 20, 10) for i in range(200)]  # engines ~25-30% busy, 20 tokens/s
    engines = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    light = simulate(requests, Topology.disaggregated(1, 1), round_settings(
        serving=ServingCosts(host_cpu_s_per_token=0.02, host_cores=2)), ROUND_MODEL)  # 0.4 cores: fits idle time
    loaded = simulate(requests, Topology.disaggregated(1, 1), round_settings(
        serving=ServingCosts(host_cpu_s_per_token=0.06, host_cores=2)), ROUND_MODEL)  # 1.2 cores: spills
    assert light.tpot_s.mean() == pytest.approx(engines.tpot_s.mean(), **EXACT)
    assert loaded.tpot_s.mean() > 1.2 * engines.tpot_s.mean()
    assert loaded.ttft_s.mean() > 1.2 * engines.ttft_s.mean()


def test_negative_costs_are_refused_naming_the_field():
    with pytest.raises(ProfileError, match="serving.handoff_s must be a number >= 0"):
        ServingCosts(handoff_s=-0.1)


def test_a_router_bound_to_the_prefill_core_stretches_only_the_prefill_steps():
    # 2 cores: the router (0.5 cores of load) bound to the prefill core, the client's 0.3 anywhere
    # prefill idle, decode stepping: the router takes its idle core, the client the half it leaves
    assert stretch_for_loads(0.3, 0.5, 2, busy_cores=1, router_cores=1, busy_router_cores=0) == 1.0
    # the client wants 0.8: 0.3 of it spills onto the decode step
    assert stretch_for_loads(0.8, 0.5, 2, busy_cores=1, router_cores=1, busy_router_cores=0) == \
        pytest.approx(1 / (1 - 0.3), **EXACT)
    # both stepping: the router's 0.5 shares the prefill core, and the client's 0.2 goes where the
    # router leaves room (the core not decoding), sharing the prefill step too: the decode step keeps its core
    both = dict(busy_cores=2, router_cores=1, busy_router_cores=1)
    assert stretch_for_loads(0.2, 0.5, 2, **both, on_router_cores=True) == pytest.approx(1 / (1 - 0.7), **EXACT)
    assert stretch_for_loads(0.2, 0.5, 2, **both, on_router_cores=False) == 1.0
    # ... and what the router's core has no room for shares the decode step
    assert stretch_for_loads(0.7, 0.5, 2, **both, on_router_cores=False) == pytest.approx(1 / (1 - 0.2), **EXACT)
    # the router shares its core even where the prefill step is the only thing there: a step starting
    # with nothing else stepping is still slowed by the router's load (processor sharing, not idle-first)
    assert stretch_for_loads(0.0, 0.25, 2, busy_cores=1, router_cores=1, busy_router_cores=1,
                             on_router_cores=True) == pytest.approx(1 / (1 - 0.25), **EXACT)
    # one core, the router bound to it: everything shares it
    assert stretch_for_loads(0.2, 0.3, 1, busy_cores=1, router_cores=1, busy_router_cores=1,
                             on_router_cores=True) == pytest.approx(1 / (1 - 0.5), **EXACT)
    # a floating router is part of the rest: the old rule exactly
    for busy in (1, 2):
        assert stretch_for_loads(0.2, 0.5, 2, busy_cores=busy) == stretch_for_load(0.7, 2, busy)
    assert stretch_for_load(1.6, 2, 1) == pytest.approx(1 / (1 - 0.6), **EXACT)


def test_an_engine_over_several_cores_loses_the_load_on_any_of_them():
    """An engine's threads meet at a barrier after every layer: what takes one of its cores holds
    the whole step (measured: bench/team_stretch.py, a two-core engine beside a burner on one core
    slowed 1.116/1.208/1.315x at 10/20/30% duty, where sharing over two cores says 1.05/1.11/1.18)."""
    # one engine over both cores, 0.2 cores of floating load: it loses 0.2 of its time, not 0.1
    assert stretch_for_loads(0.2, 0.0, 2, busy_cores=2, team_cores=2) == pytest.approx(1 / (1 - 0.2), **EXACT)
    assert stretch_for_loads(0.2, 0.0, 2, busy_cores=2) == pytest.approx(1 / (1 - 0.1), **EXACT)
    # two one-core engines stepping: each carries half the load, as before
    assert stretch_for_loads(0.2, 0.0, 2, busy_cores=2, team_cores=1) == pytest.approx(1 / (1 - 0.1), **EXACT)
    # an idle core takes the load first, whatever the team
    assert stretch_for_loads(0.2, 0.0, 4, busy_cores=2, team_cores=2) == 1.0
    # a two-core prefill engine on the router's two cores: the router's 0.3 there holds all of it
    assert stretch_for_loads(0.0, 0.3, 4, busy_cores=2, router_cores=2, busy_router_cores=2, on_router_cores=True,
                             team_cores=2) == pytest.approx(1 / (1 - 0.3), **EXACT)
    # a two-core decode engine beside it: of the client's 0.5, the router's cores (1.8 of 2 taken)
    # have room for 0.2; the 0.3 left holds the decode engine whole
    assert stretch_for_loads(0.5, 1.8, 4, busy_cores=4, router_cores=2, busy_router_cores=2,
                             on_router_cores=False, team_cores=2) == pytest.approx(1 / (1 - 0.3), **EXACT)
    # HostCpu passes the team on
    host = HostCpu(ServingCosts(host_cpu_s_per_token=0.001, host_cores=2), window_s=1.0)
    host.tokens_emitted(0.0, 200)   # 0.2 CPU seconds over a 1 s window: 0.2 cores
    assert host.stretch(0.5, busy_cores=2, team_cores=2) == pytest.approx(1 / (1 - 0.2), **EXACT)


def test_the_host_keeps_the_routers_part_apart_only_where_it_is_bound_and_measured():
    costs = ServingCosts(host_cpu_s_per_token=0.001, router_cpu_s_per_token=0.0006, host_cores=2)
    bound = HostCpu(costs, window_s=1.0, router_cores=1)
    floating = HostCpu(costs, window_s=1.0, router_cores=0)
    for host in (bound, floating):
        host.tokens_emitted(0.5, 1500)  # 1.5 cores in all: the router 0.9, the client 0.6
        assert host.load_cores(1.0) == pytest.approx(1.5, **EXACT)
    # both engines step: bound, the router's 0.9 and the 0.1 of the client's that fits share the
    # prefill core (capped at MAX_STOLEN), the client's other 0.5 the decode core
    assert bound.stretch(1.0, 2, busy_router_cores=1, on_router_cores=False) == pytest.approx(1 / (1 - 0.5), **EXACT)
    assert bound.stretch(1.0, 2, busy_router_cores=1, on_router_cores=True) == pytest.approx(1 / (1 - 0.9), **EXACT)
    assert floating.stretch(1.0, 2, busy_router_cores=1, on_router_cores=False) == pytest.approx(1 / (1 - 0.75), **EXACT)
    # a profile that did not measure the router apart: all of it floats, wherever the router is
    old = HostCpu(ServingCosts(host_cpu_s_per_token=0.001, host_cores=2), window_s=1.0, router_cores=1)
    assert old.router_cores == 0.0
    with pytest.raises(ValueError, match="router_cores must be >= 0"):
        HostCpu(costs, router_cores=-1)


def test_each_step_that_streams_wakes_the_router_and_the_client_once_whatever_its_batch():
    costs = ServingCosts(host_cpu_s_per_token=0.0003, host_cpu_s_per_step=0.002, router_cpu_s_per_token=0.0002,
                         router_cpu_s_per_step=0.0005, host_cores=2)
    one_by_one, batched = (HostCpu(costs, window_s=1.0, router_cores=1) for _ in range(2))
    for i in range(64):  # 64 tokens: 64 steps of one, or 8 steps of 8
        one_by_one.tokens_emitted(0.5 + i / 1000, 1)
    for i in range(8):
        batched.tokens_emitted(0.5 + i / 1000, 8)
    batched.tokens_emitted(0.6, 0)  # a step that streamed nothing (a prefill step that completed no prompt)
    assert one_by_one.load_cores(1.0) == pytest.approx(64 * (0.0003 + 0.002), **EXACT)
    assert batched.load_cores(1.0) == pytest.approx(64 * 0.0003 + 8 * 0.002, **EXACT)
    # both engines step: the router's part (bound to the prefill core) and the client's (no idle core
    # left: the room the router leaves) stretch a prefill step there, wake-ups included
    assert batched.stretch(1.0, 2, busy_router_cores=1, on_router_cores=True) == pytest.approx(
        1 / (1 - (64 * 0.0003 + 8 * 0.002)), **EXACT)
    with pytest.raises(ProfileError, match="router_cpu_s_per_step .* is part of serving.host_cpu_s_per_step"):
        ServingCosts(host_cpu_s_per_step=0.001, router_cpu_s_per_step=0.002)


def test_the_routers_part_cannot_exceed_the_hosts():
    with pytest.raises(ProfileError, match="router_cpu_s_per_token .* is part of serving.host_cpu_s_per_token"):
        ServingCosts(host_cpu_s_per_token=0.001, router_cpu_s_per_token=0.002)
    with pytest.raises(ProfileError, match="router_cpu_s_per_request .* is part of"):
        ServingCosts(router_cpu_s_per_request=0.001)


def test_a_bound_router_moves_the_hosts_load_from_the_decode_steps_to_the_prefill_steps():
    """1P+1D with the prefill core busy most of the time: the same host load, floating or with
    the router's part bound to the prefill core, against the engines alone."""
    requests = [spec(i * 0.3, 150, 10) for i in range(100)]  # a 0.25 s prefill every 0.3 s: 83% busy

    def run(router_part: float):
        costs = ServingCosts(host_cpu_s_per_token=0.01, router_cpu_s_per_token=router_part, host_cores=2)
        return simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs), ROUND_MODEL)
    floating, bound = run(0.0), run(0.01)
    assert bound.tpot_s.mean() < floating.tpot_s.mean()
    assert bound.ttft_s.mean() > floating.ttft_s.mean()


def test_a_bursts_router_cpu_in_a_shorter_window_delays_the_bursts_prompts_more():
    """Eight prompts at once on 1P+1D with the router bound to the prefill core: the same router CPU
    per request, spread over the default half second or over 50 ms (what queueing behind it sees)."""
    requests = [spec(0.0, 50, 2) for _ in range(8)]
    costs = ServingCosts(host_cpu_s_per_request=0.03, router_cpu_s_per_request=0.03, host_cores=2)

    def ttft_s(**window):
        settings = round_settings(serving=costs, **window)
        return simulate(requests, Topology.disaggregated(1, 1), settings, ROUND_MODEL).ttft_s
    default, short, alone = ttft_s(), ttft_s(host_window_s=0.05), \
        simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL).ttft_s
    assert alone.max() < default.max() < short.max()
    with pytest.raises(SimulationError, match="host_window_s"):
        round_settings(host_window_s=0.0)


def test_steps_beside_another_instances_step_take_the_measured_corun_stretch():
    # R1 alone: prefill 0.1525, 5 blocks pulled by 0.2075, then decode steps of 0.0201, 0.0202 and
    # 0.0203 s (context 51, 52, 53). R2 arrives at 0.22, while R1's first step runs: its prefill takes
    # 2x (0.305 s, first token at 0.525), and R1's next two steps start beside it: 1.5x each.
    costs = ServingCosts(corun_prefill_stretch=2.0, corun_decode_stretch=1.5)
    requests = [spec(0.0, 50, 4), spec(0.22, 50, 1)]
    t = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs), ROUND_MODEL).timeline
    assert t["first_token_s"].tolist() == pytest.approx([0.1525, 0.22 + 2 * 0.1525], **EXACT)
    assert t["finish_s"][0] == pytest.approx(0.2075 + 0.0201 + 1.5 * (0.0202 + 0.0203), **EXACT)
    alone = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL).timeline
    assert alone["first_token_s"].tolist() == pytest.approx([0.1525, 0.22 + 0.1525], **EXACT)
    assert alone["finish_s"][0] == pytest.approx(0.2075 + 0.0201 + 0.0202 + 0.0203, **EXACT)


def test_one_instance_alone_never_takes_the_corun_stretch():
    costs = ServingCosts(corun_prefill_stretch=2.0, corun_decode_stretch=2.0)
    requests = [spec(0.0, 50, 6), spec(0.03, 80, 3)]
    plain = simulate(requests, Topology.aggregated(1), round_settings(), ROUND_MODEL)
    corun = simulate(requests, Topology.aggregated(1), round_settings(serving=costs), ROUND_MODEL)
    for name, values in plain.timeline.items():
        assert corun.timeline[name].tolist() == values.tolist(), name


@pytest.mark.parametrize("value", [0.0, 0.3, 5.0, float("nan"), True])
def test_a_corun_stretch_outside_its_range_is_refused_naming_the_field(value):
    with pytest.raises(ProfileError, match="corun_decode_stretch"):
        ServingCosts(corun_decode_stretch=value)


def test_a_mixed_step_takes_the_prompts_stretch_with_a_chunk_and_the_decode_steps_without():
    from planner.simulator.instances import ColocatedInstance
    from planner.simulator.state import ItlLog, SimRequest

    def steps(corun):
        instance = ColocatedInstance(0, round_settings(), ROUND_MODEL, ItlLog())
        instance.enqueue(SimRequest(0, 0.0, 50, 3))
        durations, now = [], 0.0
        while (end := instance.start_step(now, corun=corun)) is not None:
            durations.append(end - now)
            instance.finish_step(end)
            now = end
        return durations

    plain, stretched = steps((1.0, 1.0)), steps((2.0, 3.0))
    # the first step computes the 50-token prompt; the next two only decode
    assert len(plain) == len(stretched) == 3
    assert stretched[0] == pytest.approx(2.0 * plain[0], **EXACT)
    assert stretched[1:] == pytest.approx([3.0 * d for d in plain[1:]], **EXACT)


def test_a_corun_ratio_measured_below_one_never_speeds_a_step_up():
    requests = [spec(0.0, 50, 4), spec(0.22, 50, 1)]
    plain = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    below = simulate(requests, Topology.disaggregated(1, 1),
                     round_settings(serving=ServingCosts(corun_prefill_stretch=0.98, corun_decode_stretch=0.9)),
                     ROUND_MODEL)
    for name, values in plain.timeline.items():
        assert below.timeline[name].tolist() == values.tolist(), name


def test_a_first_tokens_hops_share_the_routers_core_like_a_prefill_step():
    # 1P+1D, the router bound to the prefill core, 0.15 cpu-s of it per request: a third (0.05) at
    # arrival is 0.1 cores over the 0.5 s window, so the prompt (0.1525 s alone) takes 1 / 0.9 of it,
    # and so do the two hops after it (first token 4 ms, handoff 3 ms): their CPU is on that core.
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.003, host_cpu_s_per_request=0.15,
                         router_cpu_s_per_request=0.15, host_cores=2)
    result = simulate([spec(0.0, 50, 3)], Topology.disaggregated(1, 1), round_settings(serving=costs), ROUND_MODEL)
    first_token_s = 0.1525 / 0.9
    assert result.timeline["first_token_s"].tolist() == pytest.approx([first_token_s], **EXACT)
    assert result.timeline["transfer_start_s"].tolist() == pytest.approx([first_token_s + 0.003 / 0.9], **EXACT)
    assert result.ttft_s.tolist() == pytest.approx([first_token_s + 0.004 / 0.9], **EXACT)
    # without the router's load nothing stretches: the hops are the profile's
    plain = simulate([spec(0.0, 50, 3)], Topology.disaggregated(1, 1), round_settings(
        serving=ServingCosts(first_token_s=0.004, handoff_s=0.003, host_cores=2)), ROUND_MODEL)
    assert plain.ttft_s.tolist() == pytest.approx([0.1525 + 0.004], **EXACT)


def test_a_requests_host_cpu_comes_a_third_at_arrival_at_the_handoff_and_at_the_end():
    host = HostCpu(ServingCosts(host_cpu_s_per_request=0.3, host_cores=2), window_s=1.0)
    host.request_moved(0.0, prompt_tokens=100)
    assert host.load_cores(0.5) == pytest.approx(0.1, **EXACT)
    host.request_moved(0.6, prompt_tokens=100)
    host.request_moved(0.9, prompt_tokens=100)
    assert host.load_cores(1.2) == pytest.approx(0.2, **EXACT)   # the arrival's third has left the window


def test_a_requests_host_cpu_grows_with_its_prompt_and_the_routers_part_with_it():
    costs = ServingCosts(host_cpu_s_per_request=0.03, host_cpu_s_per_prompt_token=3e-5, router_cpu_s_per_request=0.015,
                         router_cpu_s_per_prompt_token=2e-5, host_cores=2)
    assert costs.host_request_cpu_s(1000) == pytest.approx(0.06, **EXACT)
    assert costs.router_request_cpu_s(1000) == pytest.approx(0.035, **EXACT)
    host = HostCpu(costs, window_s=1.0, router_cores=1)
    host.request_moved(0.0, prompt_tokens=1000)          # a third of each
    assert host.load_cores(0.5) == pytest.approx(0.02, **EXACT)
    host.request_moved(0.0, prompt_tokens=0)
    assert host.load_cores(0.5) == pytest.approx(0.03, **EXACT)
    # a profile measured before the per-prompt-token terms: a request costs its per-request CPU alone
    assert ServingCosts(host_cpu_s_per_request=0.03).host_request_cpu_s(5000) == 0.03


def test_a_longer_prompt_costs_the_workers_more_cpu_on_their_steps():
    # one prompt of 50 and one of 150 tokens, 100 us a prompt token in the prefill worker and 10 us
    # in the decode worker beyond 2 ms and 0.5 ms a request
    costs = ServingCosts(prefill_cpu_s_per_request=0.002, prefill_cpu_s_per_prompt_token=1e-4,
                         decode_cpu_s_per_request=0.0005, decode_cpu_s_per_prompt_token=1e-5)
    flat = ServingCosts(prefill_cpu_s_per_request=0.002, decode_cpu_s_per_request=0.0005)
    for prompt in (50, 150):
        result = simulate([spec(0.0, prompt, 3)], Topology.disaggregated(1, 1), round_settings(serving=costs),
                          ROUND_MODEL)
        before = simulate([spec(0.0, prompt, 3)], Topology.disaggregated(1, 1), round_settings(serving=flat),
                          ROUND_MODEL)
        # the prompt's step: 1e-4 s a prompt token more; its first decode step: 1e-5 s a prompt token more
        assert result.timeline["first_token_s"][0] - before.timeline["first_token_s"][0] == pytest.approx(
            prompt * 1e-4, **EXACT)
        first_step = lambda r: r.timeline["first_decode_token_s"][0] - r.timeline["transfer_end_s"][0]  # noqa: E731
        assert first_step(result) - first_step(before) == pytest.approx(prompt * 1e-5, **EXACT)


def test_a_routers_per_prompt_token_part_cannot_exceed_the_hosts():
    with pytest.raises(ProfileError, match="router_cpu_s_per_prompt_token"):
        ServingCosts(host_cpu_s_per_prompt_token=1e-6, router_cpu_s_per_prompt_token=2e-6)



def test_a_routers_backlog_delays_the_steps_it_lands_on_by_its_work_and_drains_when_the_core_idles():
    backlog = RouterBacklog(cores=1.0)
    backlog.add(0.0, 0.015)                        # a burst's intake: 15 ms of router CPU at once
    assert backlog.serve(0.0, 0.010) == pytest.approx(0.010)   # a 10 ms step shares the core: 20 ms
    assert backlog.serve(0.020, 0.010) == pytest.approx(0.005)  # the next takes the 5 ms left
    assert backlog.serve(0.035, 0.010) == 0.0
    backlog.add(0.050, 0.004)                       # 4 ms more while the core idles from 0.045
    assert backlog.serve(0.052, 0.010) == pytest.approx(0.002)  # 2 ms of it drained before the step
    backlog.add(0.100, 0.003)
    assert backlog.serve(0.200, 0.010) == 0.0       # an idle core took it all


def test_the_backlog_charge_moves_only_a_bound_routers_per_request_cpu_and_is_a_named_setting():
    costs = ServingCosts(host_cpu_s_per_request=0.03, router_cpu_s_per_request=0.03, host_cpu_s_per_token=0.001,
                         router_cpu_s_per_token=0.001, host_cores=2)
    host = HostCpu(costs, window_s=1.0, router_cores=1, router_charge="backlog")
    host.request_moved(0.0, 10)
    host.tokens_emitted(0.0, 5)
    assert host.load_cores(0.0) == pytest.approx(0.005)          # the tokens' router CPU, in the window
    assert host.router_delay_s(0.0, 1.0) == pytest.approx(0.010)  # the request's third, queued
    floating = HostCpu(costs, window_s=1.0, router_cores=0, router_charge="backlog")
    floating.request_moved(0.0, 10)
    assert floating.router_delay_s(0.0, 1.0) == 0.0 and floating.load_cores(0.0) == pytest.approx(0.010)
    with pytest.raises(ValueError, match="router_charge"):
        HostCpu(costs, router_charge="later")
    with pytest.raises(SimulationError, match="router_cpu_charge"):
        round_settings(router_cpu_charge="later")


def test_the_served_extra_is_interpolated_between_the_batches_measured_and_extended_past_them():
    from planner.serving_costs import interpolated_extra_s

    table = ((1.0, 0.0004), (4.0, 0.0007), (16.0, 0.001), (64.0, 0.009))
    assert interpolated_extra_s(table, 1) == pytest.approx(0.0004, **EXACT)
    assert interpolated_extra_s(table, 0.5) == pytest.approx(0.0004, **EXACT)   # below the first: the first's
    assert interpolated_extra_s(table, 2) == pytest.approx(0.0005, **EXACT)     # a third of the way to 4
    assert interpolated_extra_s(table, 40) == pytest.approx(0.005, **EXACT)     # halfway from 16 to 64
    assert interpolated_extra_s(table, 96) == pytest.approx(0.0143333333333, rel=1e-9)  # the last line: 1/6 ms a seq
    falling = ((1.0, 0.002), (2.0, 0.001))
    assert interpolated_extra_s(falling, 10) == 0.0   # extended below zero: none
    assert interpolated_extra_s(((8.0, 0.003),), 64) == 0.003   # one batch measured: its extra at every batch
    with pytest.raises(ValueError, match="no points"):
        interpolated_extra_s((), 1)


def test_the_served_step_charges_the_table_by_batch_where_asked_and_the_profile_has_one_else_the_line():
    line = ServingCosts(decode_step_s=0.0002, decode_cpu_s_per_token=0.001)
    assert line.decode_serving_s(4, by_batch=False) == pytest.approx(0.0042, **EXACT)
    assert line.decode_serving_s(4, by_batch=True) == pytest.approx(0.0042, **EXACT)   # no table: the line
    table = replace(line, served_step_extra_s=[[1, 0.0005], [8, 0.0012]])   # as JSON gives it
    assert table.served_step_extra_s == ((1.0, 0.0005), (8.0, 0.0012))
    assert table.decode_serving_s(4, by_batch=True) == pytest.approx(0.0008, **EXACT)
    assert table.decode_serving_s(4, by_batch=False) == pytest.approx(0.0042, **EXACT)
    assert table.decode_serving_s(0, True) == line.decode_serving_s(0, False) == 0.0   # no batch, no step
    for bad in ([[0, 0.001]], [[4, -0.001]], [[4, 0.001], [2, 0.002]], [[4, 0.001], [4, 0.002]], [[4]], 3):
        with pytest.raises(ProfileError, match="served_step_extra_s"):
            ServingCosts(served_step_extra_s=bad)


def test_a_decode_step_with_a_served_table_reproduces_a_hand_schedule():
    # as the first hand schedule, the line 0.0002 + 0.001 x batch replaced by a table whose batch 1 is 0.0032
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.003, decode_step_s=0.0002, decode_cpu_s_per_token=0.001,
                         decode_cpu_s_per_request=0.0005, prefill_cpu_s_per_request=0.002,
                         served_step_extra_s=((1, 0.0032), (4, 0.004)))
    settings = replace(round_settings(serving=costs), served_step="table")
    t = simulate([spec(0.0, 50, 3)], Topology.disaggregated(1, 1), settings, ROUND_MODEL).timeline
    assert t["transfer_end_s"].tolist() == pytest.approx([0.2125], **EXACT)
    # decode steps: 0.015 + 1e-4 * (51, 52) + 0.0032 (+ 0.0005 as it joins) -> 0.0238, 0.0234
    assert t["first_decode_token_s"].tolist() == pytest.approx([0.2363], **EXACT)
    assert t["finish_s"].tolist() == pytest.approx([0.2597], **EXACT)
    # the simulator's own form is the line: the first hand schedule's steps
    line = simulate([spec(0.0, 50, 3)], Topology.disaggregated(1, 1), round_settings(serving=costs), ROUND_MODEL)
    assert line.timeline["finish_s"].tolist() == pytest.approx([0.2557], **EXACT)
    with pytest.raises(SimulationError, match="served_step"):
        replace(settings, served_step="curve")
