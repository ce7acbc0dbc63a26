"""A real cluster whose router and workers export OpenTelemetry spans to a small in-test OTLP/HTTP
collector (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, as an operator sets it): one request is one trace,
the workers' spans children of the router's phase spans through the `traceparent` of each RPC."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

from cluster_helpers import start_cluster

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict


class OtlpHttpCollector:
    """Receives OTLP/HTTP protobuf exports on http://127.0.0.1:PORT/v1/traces and keeps every span."""

    def __init__(self):
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector._keep(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                    received.append(ReceivedSpan(resource["service.name"], span.name, span.trace_id.hex(),
                                                 span.span_id.hex(), span.parent_span_id.hex(), attributes))
        with self._lock:
            self.spans.extend(received)

    def wait_for(self, predicate, timeout_s: float = 15.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"spans never arrived; got {[(s.service, s.name) for s in spans]}")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_request_is_one_trace_across_the_router_and_both_workers(tiny_model, tmp_path):
    collector = OtlpHttpCollector()
    with pytest.MonkeyPatch.context() as env:   # the children inherit it (launch.supervisor.child_env)
        env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")   # export within 0.1 s, not the default 5 s
        cluster = start_cluster(tiny_model, tmp_path, "tcp")
    try:
        body = {"prompt": "Trace me across the cluster.", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        served = httpx.post(f"{cluster.http_url}/v1/completions", json=body, timeout=60)
        assert served.status_code == 200
        names = {("pdserve-router", "request"), ("pdserve-router", "prefill"), ("pdserve-router", "decode"),
                 ("pdserve-prefill", "prefill"), ("pdserve-decode", "decode"), ("pdserve-decode", "kv_transfer")}
        spans = collector.wait_for(lambda got: names <= {(s.service, s.name) for s in got})
    finally:
        cluster.stop()
        collector.stop()

    root = next(s for s in spans if s.name == "request")
    trace = [s for s in spans if s.trace_id == root.trace_id]
    by = {(s.service, s.name): s for s in trace}
    assert set(by) == names   # the whole walk, and nothing of it outside this trace
    assert root.parent_span_id == ""
    assert root.attributes["pdserve.outcome"] == "ok" and root.attributes["pdserve.path"] == "disaggregated"
    assert by["pdserve-router", "prefill"].parent_span_id == root.span_id
    assert by["pdserve-router", "decode"].parent_span_id == root.span_id
    assert by["pdserve-prefill", "prefill"].parent_span_id == by["pdserve-router", "prefill"].span_id
    assert by["pdserve-decode", "decode"].parent_span_id == by["pdserve-router", "decode"].span_id
    transfer = by["pdserve-decode", "kv_transfer"]
    assert transfer.parent_span_id == by["pdserve-decode", "decode"].span_id
    assert transfer.attributes["pdserve.kv.bytes"] == root.attributes["pdserve.kv_transfer_bytes"] > 0
    assert transfer.attributes["pdserve.kv.blocks"] >= 1
