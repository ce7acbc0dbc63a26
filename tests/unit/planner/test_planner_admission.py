"""The simulated router refuses at arrival exactly where `router.scheduler.Scheduler.check` would.

The router's cost model and the engines' prefill agree here: a prompt costs 0.4 ms per token and
nothing else, so a 1000-token prompt takes 0.4 s, alone in a step of a 1000-token budget.
Admission's prediction for a newcomer on a prefill worker is `queue_s(queued tokens, queued
prompts) + prefill_s(its prompt)`, where `queue_s(T, k) = k * prefill_s(T / k)`, the worker's
queue including its share of the router's queue ahead of the newcomer.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from loadgen.metrics import SLO
from planner.perf_model import PrefillCoeffs
from planner.simulator import RouterSettings, SimSettings, Topology, simulate
from router.policies.placement import CostModel, PlacementConfig

EXACT = dict(rel=1e-9, abs=1e-9)
COST = CostModel(fixed_s=0.0, per_token_s=0.0004, step_fixed_s=0.0, step_per_seq_s=0.0)
MODEL = dataclasses.replace(ROUND_MODEL, prefill=PrefillCoeffs(step_s=0.0, per_token_s=0.0004, per_token2_s=0.0))
BURST = [spec(0.0, 1000, 1) for _ in range(4)]


def settings(gate_tokens: int = 4096, **router) -> SimSettings:
    placement = PlacementConfig(max_queued_prefill_tokens_per_worker=gate_tokens)
    return round_settings(token_budget=1000, num_kv_blocks=1000,
                          router=RouterSettings(placement, cost=COST, **({"ttft_slo_s": 1.0} | router)))


def test_a_burst_past_the_ttft_slo_has_its_later_requests_refused():
    # R0: 0.4 s; R1 behind R0 (1000 tokens, 1 prompt): 0.4 + 0.4 = 0.8 <= 1.0; R2 behind both
    # (2000 tokens, 2 prompts): 2 x 0.4 + 0.4 = 1.2 > 1.0, refused; R3 the same
    result = simulate(BURST, Topology.disaggregated(1, 1), settings(), MODEL)
    assert result.refused.tolist() == [False, False, True, True]
    assert result.ttft_s[:2].tolist() == pytest.approx([0.4, 0.8], **EXACT)
    assert all(math.isnan(v) for v in (*result.ttft_s[2:], *result.e2el_s[2:], *result.timeline["finish_s"][2:]))
    assert result.decode_instance.tolist() == [0, 0, -1, -1]
    assert result.local_prefill.tolist() == [False, False, False, False]


def test_refused_requests_miss_in_attainment_earn_no_goodput_and_have_no_latency():
    result = simulate(BURST, Topology.disaggregated(1, 1), settings(), MODEL)
    slo = SLO(ttft_s=1.0)
    assert result.meets_slo(slo).tolist() == [True, True, False, False]
    assert result.attainment(slo) == 0.5
    assert result.duration_s == pytest.approx(0.8, **EXACT)  # the last token; the refusals came at 0
    summary = result.summary(slo)
    assert {key: summary[key] for key in ("num_prompts", "completed", "failed", "refused", "total_input_tokens",
                                          "slo_attainment", "admitted_slo_attainment")} == {
        "num_prompts": 4, "completed": 2, "failed": 2, "refused": 2, "total_input_tokens": 2000,
        "slo_attainment": 0.5, "admitted_slo_attainment": 1.0}
    assert summary["request_goodput"] == pytest.approx(2 / 0.8, **EXACT)
    assert summary["request_throughput"] == pytest.approx(2 / 0.8, **EXACT)
    # TTFT over the two served: 400 and 800 ms
    assert (summary["mean_ttft_ms"], summary["p90_ttft_ms"]) == pytest.approx((600.0, 760.0), **EXACT)
    assert summary["mean_e2el_ms"] == pytest.approx(600.0, **EXACT)


@pytest.mark.parametrize("router", [dict(admission=False), dict(ttft_slo_s=None)], ids=["admission off", "no SLO"])
def test_without_admission_or_without_an_slo_every_request_is_served_late(router):
    result = simulate(BURST, Topology.disaggregated(1, 1), settings(**router), MODEL)
    assert not result.refused.any()
    assert result.ttft_s.tolist() == pytest.approx([0.4, 0.8, 1.2, 1.6], **EXACT)
    summary = result.summary(SLO(ttft_s=1.0))
    assert (summary["completed"], summary["refused"], summary["slo_attainment"]) == (4, 0, 0.5)


def test_the_router_queue_ahead_of_a_newcomer_counts_against_its_ttft():
    # A gate of 1 token holds R1.. in the router while R0 computes. R1: the prefill worker's queue is
    # R0 (1000, 1): 0.8, taken, waits. R2: R1 is ahead of it (the same priority key): its queue is
    # (2000, 2): 1.2, refused (0.8, taken, if the router's queue were ignored). R3's 100 tokens go
    # before R1 (shortest first): nothing is ahead of it, 0.4 + 0.04 = 0.44, taken; it is sent when
    # R0's first token is back (0.4), then R1 (0.44).
    requests = [*BURST[:3], spec(0.0, 100, 1)]
    result = simulate(requests, Topology.disaggregated(1, 1), settings(gate_tokens=1), MODEL)
    assert result.refused.tolist() == [False, False, True, False]
    assert result.timeline["first_token_s"][[0, 1, 3]].tolist() == pytest.approx([0.4, 0.84, 0.44], **EXACT)


def test_the_router_queue_ahead_is_spread_over_the_prefill_workers():
    # Two prefill workers, each computing a 1000-token prompt, the gate holding the rest. R2: each
    # worker's queue (1000, 1): 0.8, taken, waits. R3: R2's (1000, 1) spread over two workers,
    # (500, 1) each: (1500, 2) -> 2 x 0.3 + 0.4 = 1.0 <= 1.05, taken. R4: (2000, 2) ahead, (1000, 1)
    # each: (2000, 2) -> 1.2, refused.
    requests = [spec(0.0, 1000, 1) for _ in range(5)]
    result = simulate(requests, Topology.disaggregated(2, 1), settings(gate_tokens=1, ttft_slo_s=1.05), MODEL)
    assert result.refused.tolist() == [False, False, False, False, True]


def test_a_tpot_slo_refuses_a_request_whose_decode_batch_would_step_too_slowly():
    # the router's decode step: 0.05 + 0.01 per request. R0 alone: 0.06 <= 0.065; R1 arrives while R0
    # decodes (its Decode call went out at its first token, 0.4 s): 0.07, refused; R2 after R0's end.
    # No TTFT SLO: TTFT is not judged.
    cost = dataclasses.replace(COST, step_fixed_s=0.05, step_per_seq_s=0.01)
    requests = [spec(0.0, 1000, 100), spec(1.0, 1000, 100), spec(60.0, 1000, 100)]
    router = RouterSettings(cost=cost, tpot_slo_s=0.065)
    result = simulate(requests, Topology.disaggregated(1, 1),
                      round_settings(token_budget=1000, num_kv_blocks=1000, router=router), MODEL)
    assert result.refused.tolist() == [False, True, False]
    assert result.timeline["finish_s"][0] < 60.0


def test_a_run_with_every_request_refused_reports_no_latencies_and_no_goodput():
    result = simulate(BURST, Topology.disaggregated(1, 1), settings(ttft_slo_s=0.3), MODEL)  # 0.4 s > 0.3 s
    assert result.refused.all() and result.duration_s == 0.0
    summary = result.summary(SLO(ttft_s=0.3))
    assert {key: summary[key] for key in ("completed", "refused", "request_goodput", "slo_attainment",
                                          "admitted_slo_attainment", "local_prefill_share", "p90_ttft_ms")} == {
        "completed": 0, "refused": 4, "request_goodput": 0.0, "slo_attainment": 0.0,
        "admitted_slo_attainment": 0.0, "local_prefill_share": 0.0, "p90_ttft_ms": 0.0}


def test_the_online_planners_latency_fn_reads_the_served_requests_when_the_router_refuses():
    from planner.evaluate import make_latency_fn, with_router_slo
    from planner.perf_model import fit_perf_model
    from planner.pool_sizes import PoolSizes
    from planner.profiles.example import build_example_profile

    profile = build_example_profile()
    aimed = with_router_slo(SimSettings.from_profile(profile), SLO(ttft_s=0.5, tpot_s=0.05))
    latencies = make_latency_fn(aimed, fit_perf_model(profile).model, num_requests=100)(PoolSizes(1, 1), 20.0, 512, 128)
    # 20 req/s is far past one prefill worker: most are refused, the served ones were predicted in
    # time when admitted (the median meets the SLO); shorter prompts arriving after one may overtake
    # it in the router's queue (shortest first), so the tail may pass the SLO by a little, not by
    # the seconds a queue without admission would add
    assert 0 < latencies.ttft_p50_s <= 0.5 and latencies.ttft_p50_s <= latencies.ttft_p90_s <= 0.5 * 1.25
    assert 0 < latencies.tpot_p50_s <= latencies.tpot_p90_s


def test_a_calibrated_simulated_router_learns_its_cost_model_runs_fast_and_refuses_as_the_live_one_would():
    # the whole TTFT calibrated: the router's cost model says 0.2 ms a token, the engines take 0.4:
    # three lone 1500-token prompts are predicted at 0.3 s and served in 0.6 s (ratio 2, relevant:
    # over a quarter of the SLO); then two arrive together: the second is predicted at 0.6 s behind
    # the first, 1.2 s calibrated, past the 1 s SLO: refused, as `Scheduler.check` with its
    # calibration would
    fast_cost = CostModel(fixed_s=0.0, per_token_s=0.0002, step_fixed_s=0.0, step_per_seq_s=0.0)
    requests = [spec(0.0, 1500, 2), spec(2.0, 1500, 2), spec(4.0, 1500, 2), spec(10.0, 1500, 2), spec(10.0, 1500, 2)]
    def run(calibrated: bool):
        router = RouterSettings(PlacementConfig(calibrate_ttft="whole"), cost=fast_cost, ttft_slo_s=1.0,
                                calibrated=calibrated)
        return simulate(requests, Topology.disaggregated(1, 1),
                        round_settings(token_budget=2000, num_kv_blocks=1000, router=router), MODEL)
    learned, as_is = run(True), run(False)
    assert learned.refused.tolist() == [False, False, False, False, True]
    assert as_is.refused.tolist() == [False] * 5
    assert as_is.ttft_s[4] == pytest.approx(1.2, **EXACT)  # admitted on the model as it is, and missed
    assert learned.ttft_s[3] == pytest.approx(0.6, **EXACT)


def test_with_the_wait_calibrated_only_requests_that_queued_teach_and_the_lesson_scales_the_wait():
    # the default: the same fast cost model, the prompts in pairs. The first of a pair waits for
    # nothing and teaches nothing; the second is predicted 0.3 s of own prefill + 0.3 s behind the
    # first and seen at 1.2 s: it waited 0.9 s, 3x its predicted wait. After two such pairs the
    # factor (the prior's four 1s and two 3s, their 0.75 quantile) is 3, and the third pair's
    # second is judged at 0.3 + 0.9 = 1.2 s, past the 1 s SLO: refused; uncalibrated, admitted to miss
    fast_cost = CostModel(fixed_s=0.0, per_token_s=0.0002, step_fixed_s=0.0, step_per_seq_s=0.0)
    requests = [spec(at_s, 1500, 2) for at_s in (0.0, 0.0, 5.0, 5.0, 10.0, 10.0)]
    def run(calibrated: bool):
        router = RouterSettings(PlacementConfig(), cost=fast_cost, ttft_slo_s=1.0, calibrated=calibrated)
        return simulate(requests, Topology.disaggregated(1, 1),
                        round_settings(token_budget=2000, num_kv_blocks=1000, router=router), MODEL)
    learned, as_is = run(True), run(False)
    assert learned.refused.tolist() == [False] * 5 + [True]
    assert as_is.refused.tolist() == [False] * 6
    assert as_is.ttft_s[5] == pytest.approx(1.2, **EXACT)
    assert learned.ttft_s[3] == pytest.approx(1.2, **EXACT)   # admitted on one lesson: the prior still outweighs it
