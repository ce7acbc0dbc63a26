"""What the router's metrics count: the outcome decision with plain values, the per-request
latency arithmetic of `Timings`, and the HTTP edge counting every request once (in-process app
over scripted workers behind the `WorkerClient` boundary; the real cluster is
tests/integration/test_metrics_scrape.py)."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from prometheus_client import REGISTRY

from kv_transfer.handle import KVHandle
from pdserve.errors import Cancelled, DeadlineExceeded, InternalError, InvalidRequest, NoHealthyWorker, Overloaded
from pdserve.timings import Timings
from pdserve.worker_api import DecodeChunk, PrefillResult
from router.http_api import create_app
from router.outcomes import RequestOutcome, outcome_of
from router.worker_client import WorkerError
from scripted_workers import ScriptedWorker, scripted_cluster

HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-a", (4,), 3)


@pytest.mark.parametrize("error, expected", [
    (None, RequestOutcome("ok", 200)),
    (InvalidRequest("prompt too long"), RequestOutcome("failed", 400)),
    (Overloaded("busy", retry_after_s=2.0), RequestOutcome("refused", 429)),
    (Cancelled("aborted"), RequestOutcome("cancelled", 499)),
    (asyncio.CancelledError(), RequestOutcome("cancelled", 499)),
    (GeneratorExit(), RequestOutcome("cancelled", 499)),
    (NoHealthyWorker("no decode worker"), RequestOutcome("failed", 503)),
    (DeadlineExceeded("too slow"), RequestOutcome("failed", 504)),
    (InternalError("oops"), RequestOutcome("failed", 500)),
    (KeyError("a bug"), RequestOutcome("failed", 500)),
])
def test_every_way_a_request_ends_has_one_outcome_and_status(error, expected):
    assert outcome_of(error) == expected


def test_tpot_is_the_time_after_the_first_token_per_later_token():
    assert Timings(ttft_s=0.5, e2e_s=2.5, output_tokens=5).tpot_s == pytest.approx(0.5)
    assert Timings(ttft_s=0.5, e2e_s=0.5, output_tokens=1).tpot_s is None
    assert Timings(output_tokens=0).tpot_s is None


def test_phases_are_those_the_request_went_through():
    disaggregated = Timings(queued_s=0.01, prefill_s=0.2, kv_transfer_bytes=4096, kv_transfer_s=0.003,
                            decode_s=1.5, decode_worker="decode-0", disaggregated=True)
    assert disaggregated.phase_seconds() == {"queue": 0.01, "prefill": 0.2, "kv_transfer": 0.003, "decode": 1.5}
    local = Timings(queued_s=0.02, decode_s=0.7, decode_worker="decode-0")
    assert local.phase_seconds() == {"queue": 0.02, "decode": 0.7}
    ended_at_first_token = Timings(queued_s=0.0, prefill_s=0.1, disaggregated=True)
    assert ended_at_first_token.phase_seconds() == {"queue": 0.0, "prefill": 0.1}


def _sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _counts() -> dict[str, float]:
    requests = {f"{outcome}/{code}": _sample("pdserve_requests_total", api="http", outcome=outcome, code=code)
                for outcome, code in (("ok", "200"), ("failed", "400"), ("failed", "503"), ("failed", "500"))}
    histograms = {name: _sample(f"pdserve_{name}_seconds_count") for name in ("ttft", "tpot", "itl", "e2e", "router_queue")}
    phases = {f"phase/{p}": _sample("pdserve_request_phase_seconds_count", phase=p)
              for p in ("queue", "prefill", "kv_transfer", "decode")}
    return requests | histograms | phases


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


async def test_http_counts_served_bad_and_failed_requests_once_each_with_their_latencies(redis_server, tokenizer):
    prefill = ScriptedWorker(prefill=PrefillResult(first_token_id=7, finished=False, kv_handle=HANDLE))
    decode = ScriptedWorker(decode=[DecodeChunk((8, 9)), DecodeChunk((10,), finished=True, finish_reason="length",
                                                                      kv_transfer_bytes=4096, kv_transfer_s=0.002)])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": prefill, "decode-a": decode})
    app = create_app(lifecycle, "tiny")
    body = {"prompt": [101, 102, 103], "max_tokens": 4, "temperature": 0}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
            before = _counts()
            served = await client.post("/v1/completions", json=body)
            streamed = await client.post("/v1/completions", json=body | {"stream": True})
            unknown_field = await client.post("/v1/completions", json=body | {"suffix": "x"})  # vLLM's, not served
            too_long = await client.post("/v1/completions", json=body | {"prompt": [101] * 100_000})  # past the context
            after_good = _counts()
            decode.decode_script = [WorkerError(grpc.StatusCode.UNAVAILABLE, "gone")]  # every decode worker fails
            unavailable = await client.post("/v1/completions", json=body)
            after_all = _counts()
    finally:
        await pool.close()
        await registry.close()

    assert [r.status_code for r in (served, streamed, unknown_field, too_long, unavailable)] == [200, 200, 400, 400, 503]
    assert "data: [DONE]" in streamed.text and '"error"' not in streamed.text
    assert _delta(before, after_good) == {
        "ok/200": 2, "failed/400": 2,
        "ttft": 2, "tpot": 2, "e2e": 2, "router_queue": 2,
        "itl": 4,  # chunks with tokens: [7], [8, 9], [10] -> two gaps per request
        "phase/queue": 2, "phase/prefill": 2, "phase/kv_transfer": 2, "phase/decode": 2,
    }
    # no decode worker could finish it after its prefill ran: failed/503; no served request's latency
    assert _delta(after_good, after_all) == {"failed/503": 1, "router_queue": 1}


async def test_the_router_exports_each_workers_load_by_worker_and_role_at_scrape_time(redis_server, tokenizer):
    from pdserve import metrics

    lifecycle, pool, registry = await scripted_cluster(
        redis_server, tokenizer, {"prefill-a": ScriptedWorker(), "decode-a": ScriptedWorker()},
        records={"decode-a": {"num_running": 3, "num_waiting": 2, "kv_blocks_used": 16, "kv_blocks_total": 64}})
    metrics.ROUTER_WORKER_LOAD.source = pool.load_rows
    try:
        with pool.track(pool.get("decode-a")):
            loads = {name: (_sample(name, worker="decode-a", role="decode"), _sample(name, worker="prefill-a", role="prefill"))
                     for name in metrics.WorkerLoadCollector.GAUGES}
    finally:
        metrics.ROUTER_WORKER_LOAD.source = None
        await pool.close()
        await registry.close()

    assert loads == {"pdserve_router_worker_running": (3, 0), "pdserve_router_worker_waiting": (2, 0),
                     "pdserve_router_worker_kv_usage_ratio": (0.25, 0), "pdserve_router_worker_inflight": (1, 0)}
    assert REGISTRY.get_sample_value("pdserve_router_worker_running", {"worker": "decode-a", "role": "decode"}) is None
