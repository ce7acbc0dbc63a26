"""Serving costs around the engines in the simulator (the router's hops, the workers' API processes,
the corun stretch, the served step by batch) and their validation, against schedules computed by hand with planner_testkit's
round-number model (prefill step 0.1 + 0.001*tokens + 1e-6*units, decode step 0.01 + 0.005*batch
+ 1e-4*context, transfer 5 ms + 10 ms per 10-token block)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from planner.profile import ProfileError
from planner.serving_costs import ServingCosts
from planner.simulator import SimulationError, Topology, simulate
from planner.simulator.instances import warmup_owed_s

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


def test_negative_costs_are_refused_naming_the_field():
    with pytest.raises(ProfileError, match="serving.handoff_s must be a number >= 0"):
        ServingCosts(handoff_s=-0.1)


def test_the_routers_part_cannot_exceed_the_hosts():
    with pytest.raises(ProfileError, match="router_cpu_s_per_token .* is part of serving.host_cpu_s_per_token"):
        ServingCosts(host_cpu_s_per_token=0.001, router_cpu_s_per_token=0.002)
    with pytest.raises(ProfileError, match="router_cpu_s_per_request .* is part of"):
        ServingCosts(router_cpu_s_per_request=0.001)


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


def test_the_client_placement_a_served_step_was_netted_with_is_kept_and_charged_by_default():
    """A profile says where its served step put the client (`ServingCosts.client_placement`; an older
    one, "router-room"); the simulator charges that placement unless told another."""
    assert ServingCosts().client_placement == "router-room"
    with pytest.raises(ProfileError, match="client_placement"):
        ServingCosts(client_placement="anywhere")
    # streams whose tokens cost the router and the client CPU, the router bound to the prefill core:
    # "router-room" puts the client there (the decode steps keep their core), "wake" part of it on
    # the stepping decode core
    costs = ServingCosts(host_cores=2, host_cpu_s_per_token=0.003, router_cpu_s_per_token=0.001,
                         client_placement="wake")
    requests = [spec(0.01 * i, 20, 40) for i in range(4)]

    def last_finish_s(**what_if) -> float:
        result = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs, **what_if), ROUND_MODEL)
        return max(result.timeline["finish_s"])

    assert last_finish_s() == last_finish_s(client_placement="wake")   # the profile's placement by default
    assert last_finish_s() > last_finish_s(client_placement="router-room")


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


def test_a_joins_warmup_is_paid_by_the_steps_after_it_a_share_of_what_is_left_each():
    # R1 alone, as above: decode steps of 0.0201, 0.0202, 0.0203 s from 0.2075. Its join owes
    # W = 0.01 + 1e-4 x 51 (prompt + its first token) = 0.0151 s, which its join step does not pay
    # and the two steps after it pay 0.3 W and 0.3 x 0.7 W.
    costs = ServingCosts(join_warmup_s=0.01, join_warmup_s_per_context_token=1e-4)
    owed = 0.01 + 1e-4 * 51
    warm = round_settings(serving=costs, join_warmup="profile")
    t = simulate([spec(0.0, 50, 4)], Topology.disaggregated(1, 1), warm, ROUND_MODEL).timeline
    assert t["first_decode_token_s"][0] == pytest.approx(0.2075 + 0.0201, **EXACT)
    assert t["finish_s"][0] == pytest.approx(0.2075 + 0.0201 + 0.0202 + 0.0203 + (0.3 + 0.21) * owed, **EXACT)
    # the default charges none of it: a what-if
    plain = simulate([spec(0.0, 50, 4)], Topology.disaggregated(1, 1), round_settings(serving=costs), ROUND_MODEL)
    assert plain.timeline["finish_s"][0] == pytest.approx(0.2075 + 0.0201 + 0.0202 + 0.0203, **EXACT)


def test_joins_close_together_owe_the_largest_warmup_not_the_sum():
    assert warmup_owed_s(0.007, [0.01]) == 0.01            # a join finds 0.7 W of the last one's left: W
    assert warmup_owed_s(0.007, [0.004, 0.006]) == 0.007   # two small joins: the earlier one's rest
    assert warmup_owed_s(0.0, []) == 0.0


def test_a_warmup_left_when_the_batch_empties_is_not_charged_to_the_next_request():
    costs = ServingCosts(join_warmup_s=0.01)
    requests = [spec(0.0, 50, 2), spec(1.0, 50, 3)]   # R1: its join step only; R2 long after, alone
    t = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=costs, join_warmup="profile"),
                 ROUND_MODEL).timeline
    r2_first = t["first_decode_token_s"][1]
    assert t["finish_s"][1] - r2_first == pytest.approx(0.0202 + 0.3 * 0.01, **EXACT)


def test_a_join_warmup_what_if_outside_its_names_is_refused():
    with pytest.raises(SimulationError, match="join_warmup must be one of"):
        replace(round_settings(), join_warmup="half")
