"""loadgen/comparison/admission.py: the router's calibration read from its metrics text (as the real
router's registry writes it), the admitted misses beside the calibration at their sending, and the
sampler against a real HTTP endpoint."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from loadgen.comparison.admission import (AdmissionSample, AdmissionSampler, admission_refusals, admission_scales,
                                          admitted_misses, describe_misses, describe_refusals, refusals_by, scale_at)
from loadgen.metrics import SLO
from loadgen.runner import RequestRecord
from pdserve.metrics import AdmissionCalibrationCollector

SLO_PAIR = SLO(ttft_s=1.0, tpot_s=0.05)


def _router_text(rows, refusals: dict[str, int] | None = None) -> str:
    """What a router with these calibration rows (and refusals by what decided them) serves at
    /metrics: the real collector, and a counter of the router's name and label, in a private registry."""
    registry, collector = CollectorRegistry(), AdmissionCalibrationCollector()
    collector.source = lambda: rows
    registry.register(collector)
    counter = Counter("pdserve_router_admission_refusals_total", "refusals", ["by"], registry=registry)
    for by, count in (refusals or {}).items():
        counter.labels(by).inc(count)
    return generate_latest(registry).decode()


def _record(index, sent_s, ttft_s, status="ok", tokens=5, step_s=0.01):
    chunks = () if status != "ok" else tuple(ttft_s + i * step_s for i in range(tokens))
    return RequestRecord(index=index, scheduled_s=sent_s, sent_s=sent_s, client_queue_s=0.0, prompt_tokens=100 + index,
                         requested_output_tokens=tokens, status=status, output_tokens=tokens if chunks else 0,
                         chunk_times_s=chunks)


def test_the_calibration_is_read_from_the_routers_metrics_text():
    assert admission_scales(_router_text([("ttft", 1.7, 20), ("tpot", 1.0, 3)])) == {"ttft": (1.7, 20), "tpot": (1.0, 3)}
    assert admission_scales(_router_text([])) == {}   # a router judging no SLO
    assert admission_scales("# HELP other x\n# TYPE other gauge\nother 1.0\n") == {}


def test_the_refusals_are_read_by_what_decided_them_and_a_run_counts_its_own():
    assert admission_refusals(_router_text([("ttft", 1.0, 0)], {"tpot": 12, "ttft": 3})) == {"tpot": 12, "ttft": 3}
    assert admission_refusals(_router_text([("ttft", 1.0, 0)])) == {}   # none refused yet: no series
    samples = (AdmissionSample(0.0, {}, {"ttft": 1}), AdmissionSample(1.0, {}, {"ttft": 1, "tpot": 2}),
               AdmissionSample(2.0, {}, {"ttft": 4, "tpot": 12, "no_worker": 1}))
    assert refusals_by(samples) == {"ttft": 3, "tpot": 12, "no_worker": 1}   # less what stood at the first sample
    assert refusals_by(samples[:1]) == {} and refusals_by(()) == {}
    assert describe_refusals(16, refusals_by(samples)) == "16 (ttft 3, tpot 12, no_worker 1)"
    assert describe_refusals(0, {}) == "0" and describe_refusals(4, {}) == "4"   # vLLM, or a router before the counter


def test_the_scale_a_request_met_is_the_last_sample_taken_before_it_was_sent():
    samples = (AdmissionSample(0.5, {"ttft": (1.0, 4)}), AdmissionSample(1.5, {"ttft": (1.6, 17)}))
    assert scale_at(samples, 0.2) is None
    assert scale_at(samples, 0.5) == (1.0, 4) and scale_at(samples, 1.4) == (1.0, 4)
    assert scale_at(samples, 9.0) == (1.6, 17)
    assert scale_at(samples, 9.0, "tpot") is None


def test_admitted_misses_are_the_requests_not_refused_that_missed_with_the_calibration_when_sent():
    samples = (AdmissionSample(0.0, {"ttft": (1.0, 0)}), AdmissionSample(2.0, {"ttft": (1.5, 16)}))
    records = [
        _record(0, 0.1, 0.4),                  # met the pair
        _record(1, 0.5, 1.3),                  # TTFT missed, before the calibration had 16
        _record(2, 1.0, 0.2, status="refused"),  # refused: not an admitted miss
        _record(3, 2.5, 0.5, step_s=0.08),     # TPOT missed, after
        _record(4, 3.0, 0.0, status="error"),  # failed: a miss
    ]
    misses = admitted_misses(records, samples, SLO_PAIR)
    assert [(m.sent_s, m.ttft_factor, m.ttft_observations) for m in misses] == [(0.5, 1.0, 0), (2.5, 1.5, 16),
                                                                                 (3.0, 1.5, 16)]
    assert misses[0].ttft_s == pytest.approx(1.3) and misses[1].tpot_s == pytest.approx(0.08)
    assert misses[2].ttft_s is None and misses[2].tpot_s is None
    assert describe_misses(misses, 16) == ("3 admitted missed: 1 sent before the TTFT calibration had 16 observations; "
                                           "TTFT factor at their sending 1.00-1.50")
    assert describe_misses([], 16) == "no admitted request missed"


def test_the_sampler_scrapes_a_real_endpoint_until_stopped_and_skips_failed_scrapes():
    # the endpoint answers scrapes 1-2 with one calibration, fails 3-7, then answers with another
    texts = {"before": _router_text([("ttft", 1.0, 2), ("tpot", 1.0, 2)]),
             "after": _router_text([("ttft", 2.5, 30), ("tpot", 1.0, 30)], {"tpot": 7})}
    answered = {"ok": 0, "failed": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            with lock:
                scrape = answered["ok"] + answered["failed"] + 1
                failing = 3 <= scrape <= 7
                answered["failed" if failing else "ok"] += 1
            if failing:
                self.send_error(500)
                return
            body = texts["before" if scrape < 3 else "after"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sampler = AdmissionSampler(f"http://127.0.0.1:{server.server_address[1]}/metrics", every_s=0.02).start()
        _wait(lambda: answered["ok"] >= 4)
        samples = sampler.stop()
    finally:
        server.shutdown()
    assert answered["failed"] == 5   # failed scrapes raised nothing in the sampler: it went on
    assert len(samples) == answered["ok"]   # one sample per answered scrape, none for a failed one
    assert [s.scales for s in samples[:2]] == [{"ttft": (1.0, 2), "tpot": (1.0, 2)}] * 2
    assert all(s.scales["ttft"] == (2.5, 30) and s.refusals == {"tpot": 7} for s in samples[2:])
    assert all(s.refusals == {} for s in samples[:2])
    assert refusals_by(samples) == {"tpot": 7}
    assert [s.at_s for s in samples] == sorted(s.at_s for s in samples)
    assert len(sampler.stop()) == len(samples)   # stopped: it samples no more


def _wait(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the sampler"
        time.sleep(0.01)
