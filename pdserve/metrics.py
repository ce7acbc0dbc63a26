"""Prometheus metrics of the router, the workers and the online planner (names prefixed `pdserve_`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)

# router: one count per request at its API edge (`router.outcomes`), latencies of served requests
REQUESTS = Counter("pdserve_requests_total",
                   "Requests the router received, by API (http, grpc), outcome (ok, failed, refused, cancelled) and "
                   "HTTP status code (gRPC requests by the same table)", ["api", "outcome", "code"])
TTFT = Histogram("pdserve_ttft_seconds", "Router receive to first token", buckets=_LATENCY_BUCKETS_S)
TPOT = Histogram("pdserve_tpot_seconds", "Time per output token after the first: (E2E - TTFT) / (output tokens - 1), "
                 "requests with 2+ output tokens", buckets=_TOKEN_BUCKETS_S)
ITL = Histogram("pdserve_itl_seconds", "Inter-token latency at the router: the gap between consecutive chunks "
                "of a stream that carry tokens", buckets=_TOKEN_BUCKETS_S)
E2E = Histogram("pdserve_e2e_seconds", "Router receive to last token", buckets=_LATENCY_BUCKETS_S)
ROUTER_QUEUE = Histogram("pdserve_router_queue_seconds", "Router receive to dispatch to a worker: the router's own "
                         "queue (admission, waiting for a turn and a placement)", buckets=_LATENCY_BUCKETS_S)
PHASE = Histogram("pdserve_request_phase_seconds", "Per-phase time of served requests: queue (router + first "
                  "engine), prefill, kv_transfer, decode (pdserve.timings.Timings)", ["phase"],
                  buckets=_LATENCY_BUCKETS_S)
KV_BYTES = Counter("pdserve_kv_transfer_bytes_total", "KV bytes moved prefill -> decode")
KV_SECONDS = Histogram("pdserve_kv_transfer_seconds", "Time a decode worker spent pulling one request's KV",
                       buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
KV_LOAD_FAILURES = Counter("pdserve_kv_load_failures_total", "Pulls that failed and were recomputed")
UNAUTHENTICATED = Counter("pdserve_unauthenticated_requests_total", "Calls to the public API refused for a missing "
                          "or wrong API key, by API (http, grpc); not in pdserve_requests_total", ["api"])
WORKER_FAILURES = Counter("pdserve_worker_failures_total", "RPCs to workers that failed and were retried", ["role"])
ADMISSION_REFUSALS = Counter("pdserve_router_admission_refusals_total",
                             "Requests the router's admission refused on arrival (in pdserve_requests_total as "
                             "refused too), by what decided it: ttft (the predicted TTFT, calibrated, missed its SLO), "
                             "tpot (the decode worker's step with the request joined missed the TPOT SLO), no_worker "
                             "(no path could take it)", ["by"])



class RowGauges:
    """Gauges read at scrape time from `source` (set by the process that owns the numbers), so the
    code that keeps them pays nothing for being watched. Each row is the `LABELS` values, then one
    value per gauge of `GAUGES` in order; no source, no rows."""

    GAUGES: dict[str, str] = {}
    LABELS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.source: Callable[[], list[tuple]] | None = None

    def describe(self):
        return [GaugeMetricFamily(name, text, labels=list(self.LABELS)) for name, text in self.GAUGES.items()]

    def collect(self):
        families = self.describe()
        for row in (self.source() if self.source is not None else ()):
            labels, values = row[:len(self.LABELS)], row[len(self.LABELS):]
            for family, value in zip(families, values):
                family.add_metric(list(labels), value)
        return families


class WorkerLoadCollector(RowGauges):
    """Per-worker load as one router sees it (source: `router.pool.WorkerPool.load_rows`). Each row
    is (worker_id, role, num_running, num_waiting, kv_usage in [0, 1], calls in flight from this
    router); the first four are what the worker last heartbeated into the registry."""

    LABELS = ("worker", "role")
    GAUGES = {
        "pdserve_router_worker_running": "Requests the worker's engine runs (its last heartbeat)",
        "pdserve_router_worker_waiting": "Requests waiting in the worker's engine (its last heartbeat)",
        "pdserve_router_worker_kv_usage_ratio": "KV blocks in use / KV blocks in the worker's cache (its last heartbeat)",
        "pdserve_router_worker_inflight": "Calls this router has in flight at the worker (exact)",
    }


ROUTER_WORKER_LOAD = WorkerLoadCollector()
REGISTRY.register(ROUTER_WORKER_LOAD)


class AdmissionCalibrationCollector(RowGauges):
    """What admission scales its predictions by in one router (source:
    `router.scheduler.Scheduler.calibration_rows`). Each row is (quantity: "ttft" or "tpot", factor
    now, relevant observations it is learned from); no rows when the router judges no SLO or its
    calibration is off. An operator reads from it how far the router's cost model is from what its
    requests see, and why admission refuses more (or less) than the model alone would."""

    LABELS = ("quantity",)
    GAUGES = {
        "pdserve_router_admission_scale_ratio":
            "What admission multiplies its prediction by now (router.policies.calibration): for ttft the "
            "predicted time to first token (or its wait, with calibrate_ttft \"wait\"), for tpot the decode step; "
            "the quantile of observed / predicted over recent relevant requests pooled with its prior (1 by default)",
        "pdserve_router_admission_calibration_observations":
            "Recent requests (within the calibration's window and age) whose observed / predicted the factor "
            "is taken from, pooled with its prior's pseudo-observations; below calibration_min_observations "
            "(default 1) the factor is the prior",
    }


ROUTER_ADMISSION_CALIBRATION = AdmissionCalibrationCollector()
REGISTRY.register(ROUTER_ADMISSION_CALIBRATION)

# worker
WORKER_GAUGES = {
    name: Gauge(f"pdserve_worker_{name}", help_text)
    for name, help_text in {
        "num_running": "Requests the engine is running",
        "num_waiting": "Requests waiting in the engine",
        "kv_blocks_used": "KV blocks in use",
        "kv_blocks_total": "KV blocks in the cache",
        "num_inflight": "Requests inside the worker's RPC handlers",
    }.items()
}

# planner (`pdserve planner --metrics-port`): its model's latency against the observed, every interval
# (`planner.model_error`); NaN where a number is unknown (nothing finished, no prediction)
PLANNER_LATENCY_METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")


def _planner_gauges(name: str, help_text: str) -> dict[str, Gauge]:
    labels = {m: f"{m.split('_')[0].upper()} {m.split('_')[1]}" for m in PLANNER_LATENCY_METRICS}  # TTFT p90
    return {m: Gauge(name.format(m), help_text.format(labels[m])) for m in PLANNER_LATENCY_METRICS}


PLANNER_PREDICTED_S = _planner_gauges(
    "pdserve_planner_predicted_{}_seconds",
    "{} the planner's model (corrected) predicts for the load observed in the last interval, seconds")
PLANNER_OBSERVED_S = _planner_gauges(
    "pdserve_planner_observed_{}_seconds", "{} observed at the routers in the last interval, seconds")
PLANNER_ERROR = _planner_gauges(
    "pdserve_planner_model_error_{}_ratio",
    "(predicted - observed) / observed {} in the last interval; > 0: the model over-predicts")
PLANNER_RECENT_ERROR = _planner_gauges(
    "pdserve_planner_model_recent_error_{}_ratio",
    "Mean |relative error| of the {} prediction over the recent scored intervals (the gate's number)")
PLANNER_CORRECTION = _planner_gauges(
    "pdserve_planner_model_correction_{}_ratio",
    "Factor the model's {} is multiplied by: observed / modelled, smoothed over intervals")
PLANNER_MODEL_TRUSTED = Gauge(
    "pdserve_planner_model_trusted",
    "1 when the planner follows its model's plan; 0 when the model's recent error is beyond --max-model-error or "
    "too few intervals were observed (only an observed SLO break then moves a pool)")


# Called with the `Timings` of every request the router finishes (router/live_stats.py adds its window).
FINISHED_OBSERVERS: list[Callable[[Any], None]] = []


def observe_finished(timings) -> None:
    """Latencies of a request served to its last token (`pdserve.timings.Timings`); it is counted
    in `pdserve_requests_total` by its API edge (`count_request`)."""
    for observer in FINISHED_OBSERVERS:
        observer(timings)
    TTFT.observe(timings.ttft_s)
    E2E.observe(timings.e2e_s)
    if timings.tpot_s is not None:
        TPOT.observe(timings.tpot_s)
    for phase, seconds in timings.phase_seconds().items():
        PHASE.labels(phase).observe(seconds)
    if timings.kv_transfer_bytes:
        KV_BYTES.inc(timings.kv_transfer_bytes)
        KV_SECONDS.observe(timings.kv_transfer_s)


def count_request(api: str, outcome: str, code: int) -> None:
    """One request's end at API edge `api` ("http", "grpc"), as `router.outcomes` classifies it."""
    REQUESTS.labels(api, outcome, str(code)).inc()


def observe_tokens_sent(previous_s: float | None) -> float:
    """A chunk with tokens is handed on now: observes the gap since `previous_s` (the last one's
    `time.perf_counter()`, None for a stream's first) as ITL; returns now, for the next call."""
    now_s = time.perf_counter()
    if previous_s is not None:
        ITL.observe(now_s - previous_s)
    return now_s


def start_metrics_server(host: str, port: int):
    """Serves this process's metrics at `http://host:port/metrics` (Prometheus text format) from a
    daemon thread, until the process exits. Port 0 picks a free port. Returns the HTTP server:
    its `server_port` is the bound port, `shutdown()` stops it."""
    server, _thread = start_http_server(port, addr=host)
    return server
