"""The spans of a request's walk (pdserve.tracing), exported in-process: the router's tree over
scripted workers behind the `WorkerClient` boundary, the trace context each worker RPC would carry,
and a worker's spans joining it. Real processes exporting over OTLP: tests/integration/test_tracing.py."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kv_transfer.handle import KVHandle
from pdserve import tracing
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeChunk, PrefillResult
from router.types import GenerationRequest
from router.worker_client import WorkerError
from scripted_workers import ScriptedWorker, scripted_cluster

PROMPT = [101, 102, 103]
HANDLE = KVHandle("x1", "10.0.0.5:7000", "prefill-a", (4,), 3)
SAMPLING = Sampling(max_tokens=4, min_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.start(SimpleSpanProcessor(exporter), "pdserve-router")
    yield exporter
    tracing.stop()


class TraceparentRecordingWorker(ScriptedWorker):
    """A scripted worker that records the W3C trace context the router's gRPC client would put on each call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.traceparents: list[str] = []

    async def prefill(self, request, timeout_s):
        self.traceparents.append(dict(tracing.outgoing_metadata())["traceparent"])
        return await super().prefill(request, timeout_s)

    async def decode(self, request, timeout_s):
        self.traceparents.append(dict(tracing.outgoing_metadata())["traceparent"])
        async for chunk in super().decode(request, timeout_s):
            yield chunk


def _tree(exporter) -> list[tuple[str, str | None, str]]:
    """(name, parent name, worker) of every finished span, in the order they ended."""
    finished = exporter.get_finished_spans()
    names = {s.context.span_id: s.name for s in finished}
    return [(s.name, names.get(s.parent.span_id) if s.parent else None, s.attributes.get("pdserve.worker_id", ""))
            for s in finished]


def _traceparent(span) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{span.context.trace_flags:02x}"


async def test_a_disaggregated_walk_with_a_resumed_decode_is_one_trace_of_phase_spans(spans, redis_server, tokenizer):
    prefill = TraceparentRecordingWorker(prefill=PrefillResult(first_token_id=7, finished=False, kv_handle=HANDLE))
    dying = TraceparentRecordingWorker(decode=[DecodeChunk((8,)), WorkerError(grpc.StatusCode.UNAVAILABLE, "gone")])
    healthy = TraceparentRecordingWorker(decode=[DecodeChunk((9, 10), finished=True, finish_reason="length",
                                                             kv_transfer_bytes=4096, kv_transfer_blocks=1)])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer,
                                                       {"prefill-a": prefill, "decode-a": dying, "decode-b": healthy})
    try:
        tokens = [t async for chunk in lifecycle.generate(GenerationRequest("req-t1", PROMPT, SAMPLING))
                  for t in chunk.token_ids]
        await lifecycle.wait_for_releases()
    finally:
        await pool.close()
        await registry.close()

    assert tokens == [7, 8, 9, 10]
    assert _tree(spans) == [("prefill", "request", "prefill-a"), ("decode", "request", "decode-a"),
                            ("decode", "request", "decode-b"), ("request", None, "")]
    finished = spans.get_finished_spans()
    assert {s.context.trace_id for s in finished} == {finished[-1].context.trace_id}
    prefill_span, failed_decode, decode_span, root = finished
    assert (failed_decode.status.status_code, failed_decode.status.description) == (StatusCode.ERROR, "UNAVAILABLE")
    assert decode_span.status.status_code == StatusCode.UNSET
    assert dict(root.attributes) == {
        "pdserve.request_id": "req-t1", "pdserve.prompt_tokens": 3, "pdserve.path": "disaggregated",
        "pdserve.outcome": "ok", "http.response.status_code": 200, "pdserve.output_tokens": 4,
        "pdserve.ttft_s": root.attributes["pdserve.ttft_s"], "pdserve.e2e_s": root.attributes["pdserve.e2e_s"],
        "pdserve.kv_transfer_bytes": 4096}
    # each RPC carries its own phase span as the parent of the worker's span
    assert prefill.traceparents == [_traceparent(prefill_span)]
    assert (dying.traceparents, healthy.traceparents) == ([_traceparent(failed_decode)], [_traceparent(decode_span)])
    assert resource_name(root) == "pdserve-router"


async def test_a_request_no_worker_can_decode_ends_its_root_span_failed_with_503(spans, redis_server, tokenizer):
    broken = ScriptedWorker(decode=[WorkerError(grpc.StatusCode.UNAVAILABLE, "gone")])
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"decode-a": broken})
    try:
        with pytest.raises(Exception, match="no decode worker could take the request"):
            [chunk async for chunk in lifecycle.generate(GenerationRequest("req-t2", PROMPT, SAMPLING))]
    finally:
        await pool.close()
        await registry.close()

    assert _tree(spans) == [("decode", "request", "decode-a"), ("request", None, "")]
    root = spans.get_finished_spans()[-1]
    assert (root.attributes["pdserve.outcome"], root.attributes["http.response.status_code"]) == ("failed", 503)
    assert root.attributes["pdserve.path"] == "local"
    assert root.status.status_code == StatusCode.ERROR


class _CallContext:
    """The part of a `grpc.aio.ServicerContext` a worker span reads: the call's metadata."""

    def __init__(self, metadata):
        self.metadata = tuple(metadata)

    def invocation_metadata(self):
        return self.metadata


def test_a_worker_decode_span_joins_the_router_phase_and_records_the_kv_pull_as_a_child(spans):
    with tracing.request_trace("req-t3", 40).phase("decode", "decode-a") as router_decode:
        metadata = tracing.outgoing_metadata()
    with tracing.worker_span("decode", _CallContext(metadata), "req-t3") as worker_decode:
        worker_decode.decoded(DecodeChunk((5,), finished=True, kv_transfer_bytes=8192, kv_transfer_s=0.25,
                                          kv_transfer_blocks=2, kv_loaded_tokens=40, queued_s=0.5))

    transfer, decode = spans.get_finished_spans()[-2:]
    assert (transfer.name, decode.name) == ("kv_transfer", "decode")
    assert decode.parent.span_id == router_decode.span.context.span_id
    assert transfer.parent.span_id == decode.context.span_id
    assert transfer.context.trace_id == decode.context.trace_id == router_decode.span.context.trace_id
    assert (transfer.start_time - decode.start_time, transfer.end_time - transfer.start_time) == (500_000_000, 250_000_000)
    assert dict(transfer.attributes) == {"pdserve.kv.bytes": 8192, "pdserve.kv.blocks": 2, "pdserve.kv.seconds": 0.25,
                                         "pdserve.kv.loaded_tokens": 40}


def test_tracing_is_off_without_an_endpoint_and_rejects_a_non_http_one():
    assert tracing.configure(tracing.TracingConfig("")) is False
    assert tracing.request_trace("req", 1) is tracing.NO_TRACE
    assert tracing.client_interceptors() == []
    with pytest.raises(ValueError, match="OTLP/HTTP URL"):
        tracing.TracingConfig("collector:4317")


def test_with_tracing_off_the_router_and_worker_paths_import_no_tracing_sdk_exporter_or_propagator():
    # (redis-py imports opentelemetry's metrics API on its own; these are what tracing would bring)
    code = ("import sys, router.lifecycle, router.grpc_worker_client, pdserve.worker.server, pdserve.tracing\n"
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter', "
            "'opentelemetry.trace.propagation.tracecontext'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def resource_name(span) -> str:
    return span.resource.attributes["service.name"]
