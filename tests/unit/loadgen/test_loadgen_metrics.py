"""Metric definitions (vllm bench serve's) on hand-made timestamps with exact expected values."""

import pytest

from loadgen.metrics import SLO, achieved_request_rate, meets_slo, peaks, slo_attainment, summarize, tpot_s
from loadgen.runner import RequestRecord
from loadgen.targets.base import PhaseTimings


def _record(index, status, chunk_times_s=(), output_tokens=0, prompt_tokens=10, error="", phases=None, sent_s=0.0):
    return RequestRecord(index=index, scheduled_s=0.0, sent_s=sent_s, client_queue_s=0.0, prompt_tokens=prompt_tokens,
                         requested_output_tokens=output_tokens or 1, status=status, error=error,
                         output_tokens=output_tokens, chunk_times_s=chunk_times_s, phases=phases)


A = _record(0, "ok", (0.1, 0.15, 0.25, 0.30), 4, 10, phases=PhaseTimings(0.01, 0.05, 0.02, 1000, 0.2))
B = _record(1, "ok", (0.2, 0.3), 2, 20, phases=PhaseTimings(0.03, 0.07, 0.04, 3000, 0.1))
C = _record(2, "ok", (0.4,), 1, 30)
D = _record(3, "error", (), 0, 40, error="TargetError: HTTP 500: boom")
E = _record(4, "timeout", (0.05,), 1, 50, error="no complete response within 1 s")
RUN = [A, B, C, D, E]


def test_per_request_definitions():
    assert (A.ttft_s, A.e2el_s) == (0.1, 0.30)
    assert tpot_s(A) == pytest.approx(0.2 / 3)
    assert A.itls_s == pytest.approx((0.05, 0.1, 0.05))
    assert tpot_s(C) is None  # one output token: no TPOT
    assert (E.ttft_s, E.e2el_s, E.itls_s, tpot_s(E)) == (None, None, (), None)  # partial output is not a success


def test_counts_and_throughputs():
    s = summarize(RUN, duration_s=2.0)
    assert (s["num_prompts"], s["completed"], s["failed"], s["timed_out"]) == (5, 3, 2, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (60, 7)
    assert s["request_throughput"] == 1.5
    assert s["output_throughput"] == 3.5
    assert s["total_token_throughput"] == 33.5
    assert s["errors_by_kind"] == {"TargetError: HTTP 500: boom": 1, "no complete response within 1 s": 1}
    assert s["request_goodput"] is None and s["slo_attainment"] is None


def test_latency_distributions_in_ms_with_vllm_keys():
    s = summarize(RUN, duration_s=2.0)
    assert s["mean_ttft_ms"] == pytest.approx(700 / 3)
    assert s["median_ttft_ms"] == pytest.approx(200)
    assert s["p90_ttft_ms"] == pytest.approx(360)  # numpy linear interpolation over [100, 200, 400]
    assert s["p99_ttft_ms"] == pytest.approx(396)
    assert s["mean_tpot_ms"] == pytest.approx((200 / 3 + 100) / 2)
    assert s["p90_tpot_ms"] == pytest.approx(200 / 3 + 0.9 * (100 - 200 / 3))
    assert s["mean_itl_ms"] == pytest.approx(75)
    assert s["median_itl_ms"] == pytest.approx(75)
    assert s["std_itl_ms"] == pytest.approx(25)
    assert s["mean_e2el_ms"] == pytest.approx(1000 / 3)
    assert s["median_e2el_ms"] == pytest.approx(300)


def test_slo_attainment_counts_failures_as_misses_and_goodput_is_good_per_second():
    slo = SLO(ttft_s=0.25, tpot_s=0.09)
    assert [meets_slo(r, slo) for r in RUN] == [True, False, False, False, False]
    s = summarize(RUN, duration_s=2.0, slo=slo)
    assert s["slo_attainment"] == 0.2
    assert s["request_goodput"] == 0.5
    # a one-token output has TPOT 0 for the SLO check, as in vLLM's goodput
    assert slo_attainment(RUN, SLO(tpot_s=0.09)) == 0.4


def test_a_value_equal_to_its_slo_meets_it_as_in_vllm():
    exact = _record(0, "ok", (0.5, 0.75, 1.0), 3)  # TTFT 0.5 s, TPOT (1.0 - 0.5) / 2 = 0.25 s, E2EL 1.0 s
    assert (exact.ttft_s, tpot_s(exact), exact.e2el_s) == (0.5, 0.25, 1.0)
    assert meets_slo(exact, SLO(ttft_s=0.5, tpot_s=0.25, e2el_s=1.0))
    assert not meets_slo(exact, SLO(ttft_s=0.4999))
    assert not meets_slo(exact, SLO(tpot_s=0.2499))
    assert not meets_slo(exact, SLO(e2el_s=0.9999))


def test_an_e2el_slo_alone_counts_requests_finishing_in_time():
    slo = SLO(e2el_s=0.3)  # A ends at 0.30 and B at 0.3 (met: equal), C at 0.4; D and E failed
    assert [meets_slo(r, slo) for r in RUN] == [True, True, False, False, False]
    s = summarize(RUN, duration_s=2.0, slo=slo)
    assert (s["slo_attainment"], s["request_goodput"]) == (0.4, 1.0)


def test_peak_output_rate_and_concurrency_use_vllms_one_second_buckets():
    runs = [_record(0, "ok", (0.2, 0.4, 0.6, 1.2), 4, sent_s=0.0),  # chunks at 0.2 0.4 0.6 | 1.2
            _record(1, "ok", (0.1, 0.3), 2, sent_s=0.5),  # chunks at 0.6 0.8
            _record(2, "ok", (0.1,), 1, sent_s=2.5),  # chunk at 2.6
            _record(3, "error", (), 0, sent_s=1.0, error="x")]  # not counted
    assert peaks([r for r in runs if r.ok]) == (5.0, 2)  # bucket 0: 5 chunks; requests 0 and 1 in flight
    assert peaks([]) == (0.0, 0)
    s = summarize(runs, duration_s=3.0)
    assert (s["max_output_tokens_per_s"], s["max_concurrent_requests"]) == (5.0, 2)
    assert s["achieved_request_rate"] == 4 / 2.5  # 4 sent, the last at 2.5 s
    assert achieved_request_rate([_record(0, "ok", (0.1,), 1)]) is None  # all sent at once


def test_phase_breakdown_for_responses_that_carry_timings():
    s = summarize(RUN, duration_s=2.0)
    assert s["mean_queued_ms"] == pytest.approx(20)
    assert s["mean_prefill_ms"] == pytest.approx(60)
    assert s["mean_kv_transfer_ms"] == pytest.approx(30)
    assert s["mean_decode_ms"] == pytest.approx(150)
    assert (s["mean_kv_transfer_bytes"], s["total_kv_transfer_bytes"]) == (2000.0, 4000.0)
    assert s["disaggregated_requests"] == 2
    assert "mean_prefill_ms" not in summarize([C], duration_s=1.0)


def test_empty_distributions_read_zero_like_vllm():
    s = summarize([D], duration_s=1.0)
    assert (s["completed"], s["failed"], s["mean_ttft_ms"], s["p99_e2el_ms"]) == (0, 1, 0.0, 0.0)


def test_slo_rejects_non_positive_limits():
    with pytest.raises(ValueError, match="ttft_s must be > 0"):
        SLO(ttft_s=0)
    assert SLO(ttft_s=0.5, tpot_s=0.05).as_ms() == {"ttft": 500.0, "tpot": 50.0}
