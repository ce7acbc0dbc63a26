"""The simulator's host model (planner/simulator/host.py): the CPU the router, the clients and the
workers' API processes take beside the engines, where it lands (idle cores first, a bound router's
core, an engine's whole team) and how it stretches the steps it shares a core with; against plain
values and schedules computed by hand with planner_testkit's round-number model (prefill step 0.1 +
0.001*tokens + 1e-6*units, decode step 0.01 + 0.005*batch + 1e-4*context, transfer 5 ms + 10 ms per
10-token block)."""

from __future__ import annotations

import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from planner.profile import ProfileError
from planner.serving_costs import ServingCosts
from planner.simulator import SimulationError, Topology, simulate
from planner.simulator.host import HostCpu, RouterBacklog, stretch_for_load, stretch_for_loads, wake_share_on_router

EXACT = dict(abs=1e-12)


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


def test_a_step_on_the_routers_core_loses_at_most_the_named_share_there_and_the_others_keep_the_default():
    both = dict(busy_cores=2, router_cores=1, busy_router_cores=1)
    # the router's 0.7 cores on its one core: the prefill step there 1 / 0.3 by processor sharing,
    # 2x where a fair scheduler keeps the stepping engine half its core
    assert stretch_for_loads(0.0, 0.7, 2, **both, on_router_cores=True) == pytest.approx(1 / 0.3, **EXACT)
    assert stretch_for_loads(0.0, 0.7, 2, **both, on_router_cores=True, router_core_max_stolen=0.5) == \
        pytest.approx(2.0, **EXACT)
    # the decode step on the other core: the client's 0.95 less the 0.3 the router's core has room for
    assert stretch_for_loads(0.95, 0.7, 2, **both, on_router_cores=False, router_core_max_stolen=0.5) == \
        pytest.approx(1 / 0.35, **EXACT)
    host = HostCpu(ServingCosts(host_cpu_s_per_token=0.001, router_cpu_s_per_token=0.001, host_cores=2),
                   window_s=1.0, router_cores=1, router_core_max_stolen=0.5)
    host.tokens_emitted(0.0, 800)   # the router's 0.8 cores
    assert host.stretch(0.5, 2, busy_router_cores=1, on_router_cores=True) == pytest.approx(2.0, **EXACT)
    for bad in (0.0, 0.95):
        with pytest.raises(ValueError, match="router_core_max_stolen"):
            HostCpu(ServingCosts(host_cores=2), router_core_max_stolen=bad)
    with pytest.raises(SimulationError, match="router_core_max_stolen"):
        round_settings(router_core_max_stolen=1.0)


def test_a_first_token_under_a_heavy_router_takes_at_most_twice_its_time_where_the_engine_keeps_half_its_core():
    # 1P+1D, the router bound to the prefill core with 2.1 cpu-s a request: a third (0.7) at arrival
    # is 1.4 cores over the 0.5 s window; the prompt (0.1525 s alone) takes 1 / (1 - 0.9) of it by
    # default (the cap of every step) and 1 / (1 - 0.5) where the router may take half its core
    costs = ServingCosts(host_cpu_s_per_request=2.1, router_cpu_s_per_request=2.1, host_cores=2)

    def first_token_s(**what_if):
        settings = round_settings(serving=costs, **what_if)
        return simulate([spec(0.0, 50, 3)], Topology.disaggregated(1, 1), settings, ROUND_MODEL).timeline["first_token_s"][0]
    assert first_token_s() == pytest.approx(0.1525 / (1 - 0.9), **EXACT)
    assert first_token_s(router_core_max_stolen=0.5) == pytest.approx(0.1525 * 2, **EXACT)


def test_a_balanced_client_shares_every_stepping_core_while_the_routers_steps_too():
    # 0.4 cores of client beside a router taking 0.3 of its one core; both cores step
    both = dict(busy_cores=2, router_cores=1, busy_router_cores=1)
    # the router's room first (today's): all of it on the router's core, none on the decode core
    assert stretch_for_loads(0.4, 0.3, 2, **both, on_router_cores=False) == 1.0
    assert stretch_for_loads(0.4, 0.3, 2, **both, on_router_cores=True) == pytest.approx(1 / (1 - 0.7), **EXACT)
    # balanced: half of it on each stepping core
    assert stretch_for_loads(0.4, 0.3, 2, **both, on_router_cores=False, client_placement="balanced") == \
        pytest.approx(1 / (1 - 0.2), **EXACT)
    assert stretch_for_loads(0.4, 0.3, 2, **both, on_router_cores=True, client_placement="balanced") == \
        pytest.approx(1 / (1 - 0.5), **EXACT)
    # the router's core idle: its room is the client's first either way
    idle_router = dict(busy_cores=1, router_cores=1, busy_router_cores=0)
    assert stretch_for_loads(0.4, 0.3, 2, **idle_router, client_placement="balanced") == \
        stretch_for_loads(0.4, 0.3, 2, **idle_router) == 1.0
    with pytest.raises(SimulationError, match="client_placement"):
        round_settings(client_placement="anywhere")


def test_a_woken_client_takes_the_routers_core_as_often_as_it_is_idle_and_half_of_it_otherwise():
    # x = C (1 - (L + b + x) / (2R)): C 0.4, router 0.3, its core idle of engines: x = 0.4 * 0.85 / 1.2
    assert wake_share_on_router(0.4, 0.3, 0, 1) == pytest.approx(0.4 * 0.85 / 1.2, **EXACT)
    x = wake_share_on_router(0.4, 0.3, 0, 1)
    assert x == pytest.approx(0.4 * (1 - (0.3 + x) / 2), **EXACT)   # it is its own fixed point
    # an engine stepping there fills the core: half of it either way
    assert wake_share_on_router(0.4, 0.3, 1, 1) == pytest.approx(0.2, **EXACT)
    # a router past its core alone, or a client that would fill what is left: the core is full, half
    assert wake_share_on_router(0.4, 1.2, 0, 1) == pytest.approx(0.2, **EXACT)
    assert wake_share_on_router(1.6, 0.6, 0, 1) == pytest.approx(0.8, **EXACT)   # 0.6 + 0.8 > 1
    # two router cores: the same over their sum
    assert wake_share_on_router(0.8, 0.6, 0, 2) == pytest.approx(0.8 * 0.85 / 1.2, **EXACT)
    assert wake_share_on_router(0.0, 0.3, 0, 1) == wake_share_on_router(0.4, 0.3, 0, 0) == 0.0


def test_the_wake_placement_puts_the_rest_of_the_client_on_the_stepping_decode_core():
    # the decode core steps, the router's does not: 0.4 of client, the router 0.3
    decode_stepping = dict(busy_cores=1, router_cores=1, busy_router_cores=0)
    on_router = 0.4 * 0.85 / 1.2
    assert stretch_for_loads(0.4, 0.3, 2, **decode_stepping, client_placement="wake") == \
        pytest.approx(1 / (1 - (0.4 - on_router)), **EXACT)
    assert stretch_for_loads(0.4, 0.3, 2, **decode_stepping) == 1.0   # router-room: none there
    # both step: half the client on each core; the prefill step also loses the router's 0.3
    both = dict(busy_cores=2, router_cores=1, busy_router_cores=1)
    assert stretch_for_loads(0.4, 0.3, 2, **both, on_router_cores=False, client_placement="wake") == \
        pytest.approx(1 / (1 - 0.2), **EXACT)
    assert stretch_for_loads(0.4, 0.3, 2, **both, on_router_cores=True, client_placement="wake") == \
        pytest.approx(1 / (1 - 0.5), **EXACT)
    # an idle decode core takes the client first, whatever the placement
    assert stretch_for_loads(0.4, 0.3, 2, busy_cores=1, router_cores=1, busy_router_cores=1,
                             on_router_cores=True, client_placement="wake") == pytest.approx(1 / (1 - 0.3), **EXACT)
