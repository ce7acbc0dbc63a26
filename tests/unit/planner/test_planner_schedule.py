"""The simulator reproduces schedules computed by hand with the round-number model of
planner_testkit (prefill step 0.1 + 0.001*tokens + 1e-6*units, decode step 0.01 + 0.005*batch
+ 1e-4*context, transfer 5 ms + 10 ms per 10-token block)."""

from __future__ import annotations

import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from planner.simulator import Topology, simulate

EXACT = dict(abs=1e-12)


def test_single_prefill_single_decode_reproduces_hand_schedule():
    requests = [spec(0.0, 50, 12), spec(0.0, 80, 2), spec(0.05, 30, 1)]
    result = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    t = result.timeline
    # prefill step 1 at 0: R0 50 + R1 50 tokens, units 2500 + 2500 -> 0.1 + 0.1 + 0.005 = 0.205
    # prefill step 2 at 0.205: R1 30 (units 80^2-50^2 = 3900) + R2 30 (900) -> 0.1648, ends 0.3698
    assert t["prefill_start_s"].tolist() == pytest.approx([0.0, 0.0, 0.205], **EXACT)
    assert t["first_token_s"].tolist() == pytest.approx([0.205, 0.3698, 0.3698], **EXACT)
    # R0 pulls 5 blocks (5000 B): 0.055 s, at once (the decode engine is idle); R2 has nothing to decode.
    # R0 decodes alone from 0.26: step k costs 0.015 + 1e-4*(50+k), ending 0.2801, 0.3003, 0.3206,
    # 0.3410, 0.3615, 0.3821, ... R1 is handed over at 0.3698, during step 6: the engine sees it when
    # that step ends, so its pull of 8 blocks (0.085 s) runs 0.3821 -> 0.4671, beside steps 7-11
    assert t["transfer_start_s"].tolist() == pytest.approx([0.205, 0.3821, 0.3698], **EXACT)
    assert t["transfer_end_s"].tolist() == pytest.approx([0.26, 0.4671, 0.3698], **EXACT)
    # R0's 11 steps end at 0.4866 (its last token); R1 joins at that boundary, the first after its
    # pull: batch 1, context 81 -> 0.0231, its one decode token at 0.5097
    assert t["first_decode_token_s"].tolist() == pytest.approx([0.2801, 0.5097, 0.3698], **EXACT)
    assert t["finish_s"].tolist() == pytest.approx([0.4866, 0.5097, 0.3698], **EXACT)
    assert result.ttft_s.tolist() == pytest.approx([0.205, 0.3698, 0.3198], **EXACT)
    assert result.tpot_s[:2].tolist() == pytest.approx([(0.4866 - 0.205) / 11, 0.1399], **EXACT)
    assert result.itl_step_s.tolist() == pytest.approx([0.0202, 0.0203, 0.0204, 0.0205, 0.0206,
                                                         0.0207, 0.0208, 0.0209, 0.0210, 0.0211], **EXACT)
    assert sorted(result.itl_s.tolist()) == pytest.approx(
        sorted([0.0751, 0.1399, 0.0202, 0.0203, 0.0204, 0.0205, 0.0206, 0.0207, 0.0208, 0.0209, 0.0210, 0.0211]),
        **EXACT)
    assert result.busy_s["prefill"] == pytest.approx([0.3698], **EXACT)


def test_single_colocated_instance_reproduces_hand_schedule():
    requests = [spec(0.0, 50, 3), spec(0.1, 30, 2)]
    result = simulate(requests, Topology.colocated(1), round_settings(), ROUND_MODEL)
    t = result.timeline
    # step 1: R0's 50 tokens alone -> 0.1525. step 2: R0 decodes (batch 1, context 51) while R1's
    # 30 tokens prefill: 0.1 + 0.03 + 0.0009 + 0.005 + 0.0051 = 0.141 -> 0.2935.
    # step 3: batch 2, context 52 + 31 -> 0.0283 -> 0.3218
    assert t["first_token_s"].tolist() == pytest.approx([0.1525, 0.2935], **EXACT)
    assert t["prefill_start_s"].tolist() == pytest.approx([0.0, 0.1525], **EXACT)
    assert t["first_decode_token_s"].tolist() == pytest.approx([0.2935, 0.3218], **EXACT)
    assert t["finish_s"].tolist() == pytest.approx([0.3218, 0.3218], **EXACT)
    assert result.ttft_s.tolist() == pytest.approx([0.1525, 0.1935], **EXACT)
    assert result.tpot_s.tolist() == pytest.approx([(0.3218 - 0.1525) / 2, 0.0283], **EXACT)
    assert sorted(result.itl_s.tolist()) == pytest.approx([0.0283, 0.0283, 0.141], **EXACT)


def test_transfers_into_one_decode_instance_are_serialized():
    requests = [spec(0.0, 20, 2), spec(0.0, 20, 2)]
    result = simulate(requests, Topology.disaggregated(1, 1), round_settings(), ROUND_MODEL)
    # both prompts finish in one step: 0.1 + 0.04 + 0.0008 = 0.1408; each pulls 2 blocks: 0.025 s
    t = result.timeline
    assert t["transfer_start_s"].tolist() == pytest.approx([0.1408, 0.1658], **EXACT)
    assert t["transfer_end_s"].tolist() == pytest.approx([0.1658, 0.1908], **EXACT)


def test_two_decode_instances_take_one_transfer_each_when_placed_at_handoff():
    requests = [spec(0.0, 20, 2), spec(0.0, 20, 2)]
    result = simulate(requests, Topology.disaggregated(1, 2), round_settings(decode_pick="handoff"), ROUND_MODEL)
    t = result.timeline
    assert t["transfer_start_s"].tolist() == pytest.approx([0.1408, 0.1408], **EXACT)
    assert t["transfer_end_s"].tolist() == pytest.approx([0.1658, 0.1658], **EXACT)


def test_request_waits_for_kv_blocks_until_the_running_one_frees_them():
    # R0 needs ceil(80/10) = 8 blocks, R1 ceil(30/10) = 3: 11 > 10, so R1 waits for R0 to finish
    requests = [spec(0.0, 50, 30), spec(0.0, 20, 10)]
    result = simulate(requests, Topology.disaggregated(1, 1), round_settings(num_kv_blocks=10), ROUND_MODEL)
    t = result.timeline
    assert t["first_token_s"][0] == t["first_token_s"][1]
    assert t["transfer_start_s"][1] == pytest.approx(t["finish_s"][0], **EXACT)
    assert t["transfer_start_s"][1] > t["transfer_end_s"][0] + 0.5


def test_prompts_go_to_the_prefill_instance_with_the_shortest_predicted_wait():
    # router.policies.placement: R0 -> P0 (tie broken by worker id), R1 -> P1 (P0 has 80 tokens queued).
    # R1 is answered at 0.1 + 0.03 + 0.0009 = 0.1309, so R2 (0.15) finds P1 empty: 0.15 + 0.1101.
    # R3 (0.16) sees 80 tokens queued on P0 and 10 on P1 (the router cannot see that R0 is nearly
    # done): P1, after R2: 0.2601 + 0.1101
    requests = [spec(0.0, 80, 2), spec(0.0, 30, 2), spec(0.15, 10, 2), spec(0.16, 10, 2)]
    result = simulate(requests, Topology.disaggregated(2, 1), round_settings(), ROUND_MODEL)
    assert result.timeline["first_token_s"].tolist() == pytest.approx([0.1864, 0.1309, 0.2601, 0.3702], **EXACT)


def test_request_larger_than_the_kv_cache_is_refused_with_a_fix():
    from planner.simulator import SimulationError

    with pytest.raises(SimulationError, match="needs 11 KV blocks but an instance holds 10"):
        simulate([spec(0.0, 100, 10)], Topology.colocated(1), round_settings(num_kv_blocks=10), ROUND_MODEL)
