"""A first token's hops under load (`SimSettings.hops`): "queued", the profile's latencies plus the
waits behind the decode side's outputs in the router and the decode worker's API process
(`planner.simulator.host.router_outputs_wait_s`, `decode_call_wait_s`), on hand schedules."""

from __future__ import annotations

import pytest

from planner.serving_costs import ServingCosts
from planner.simulator import SimulationError, Topology, simulate
from planner.simulator.host import decode_call_wait_s, router_outputs_wait_s
from planner_testkit import ROUND_MODEL, round_settings, spec


def test_the_decode_workers_wait_is_a_steps_outputs_at_half_the_core_while_the_engine_steps():
    assert decode_call_wait_s(10, 0.0002, engine_stepping=True) == pytest.approx(0.004)
    assert decode_call_wait_s(10, 0.0002, engine_stepping=False) == 0.0      # handled as it went idle
    assert decode_call_wait_s(0, 0.0002, engine_stepping=True) == 0.0


def test_the_routers_wait_is_the_running_steps_tokens():
    assert router_outputs_wait_s(30, 0.0001) == pytest.approx(0.003)
    assert router_outputs_wait_s(0, 0.0001) == 0.0


def run(hops: str):
    """Two requests prefilled together at 0 (one 100-token step: 0.1 + 0.1 + 0.01 = 0.21 s), handed to
    an idle decode engine, and a third at 0.5 (its prompt done at 0.6525) handed over while those two
    decode, with the host unmodelled (every stretch 1)."""
    costs = ServingCosts(first_token_s=0.004, handoff_s=0.003, decode_cpu_s_per_token=0.002,
                         router_cpu_s_per_token=0.001, host_cpu_s_per_token=0.001)
    requests = [spec(0.0, 50, 40), spec(0.0, 50, 40), spec(0.5, 50, 4)]
    return simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs, hops=hops), ROUND_MODEL)


def test_queued_hops_wait_behind_the_decode_sides_outputs():
    stretched, queued = run("stretched"), run("queued")
    for result in (stretched, queued):
        assert result.timeline["first_token_s"][2] == pytest.approx(0.6525)
    hops = lambda r: list(r.timeline["handed_off_s"] - r.timeline["first_token_s"])  # noqa: E731
    assert hops(stretched) == pytest.approx([0.003, 0.003, 0.003])
    # the first two find nothing decoding; the third, the router relaying two streams (2 x 1 ms), then
    # the decode worker's API process their step's two outputs at half its core (2 x 2 ms x 2)
    assert hops(queued) == pytest.approx([0.003, 0.003, 0.003 + 0.002 + 0.008])
    # the first token waits in the router as well: the client sees it 2 ms later
    assert queued.ttft_s[2] - stretched.ttft_s[2] == pytest.approx(0.002)
    assert queued.ttft_s[:2] == pytest.approx(stretched.ttft_s[:2])


def test_an_unknown_hop_model_is_refused():
    with pytest.raises(SimulationError, match="hops"):
        round_settings(hops="queue")


def test_a_pull_to_an_idle_decode_engine_starts_once_the_engine_is_awake():
    costs = ServingCosts(handoff_s=0.003, idle_join_s=0.05)
    requests = [spec(0.0, 50, 40), spec(0.5, 50, 4)]
    for topology in (Topology.disaggregated(1, 1), Topology.hybrid(1, 1, local_prefill_max_tokens=1)):  # none local
        t = simulate(requests, topology, round_settings(serving=costs), ROUND_MODEL).timeline
        # the first finds the engine idle: 50 ms before its pull; the second comes while the first
        # decodes (steps of about 21 ms) and pulls when the step running ends
        assert t["transfer_start_s"][0] - t["handed_off_s"][0] == pytest.approx(0.05), topology
        assert 0 <= t["transfer_start_s"][1] - t["handed_off_s"][1] < 0.025, topology
    untraced = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=ServingCosts(handoff_s=0.003)),
                        ROUND_MODEL).timeline
    assert untraced["transfer_start_s"][0] == pytest.approx(untraced["handed_off_s"][0])
