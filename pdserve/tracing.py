"""OpenTelemetry spans of a request's walk, joined by one trace id across the router and both workers.

    router   request                       (root: request id, prompt tokens, path, outcome, code)
               +- prefill                  (around the Prefill RPC; one per attempt)
               |    +- prefill             (prefill worker, from the W3C `traceparent` of the RPC)
               +- decode                   (around the Decode stream; one per attempt)
                    +- decode              (decode worker)
                         +- kv_transfer    (the connector's pull: bytes, blocks, seconds)

Off unless `configure` is given an OTLP endpoint (`--otlp-traces-endpoint`, or the standard
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT read by the entry point). Off, nothing imports opentelemetry and
every hook returns a shared no-op: a global read per request or RPC is the whole cost.

No hook attaches an OpenTelemetry context (which would have to be detached in the same context,
and the request's walk yields to its consumer between chunks). Spans are started with an explicit
parent; the parent of the next worker RPC a task sends is one context variable, set by `phase`
and read by the gRPC client interceptor at call creation (per asyncio task: per request).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from urllib.parse import urlparse

import grpc

_tracer = None     # an opentelemetry Tracer while tracing is on
_provider = None
_rpc_parent: contextvars.ContextVar = contextvars.ContextVar("pdserve_rpc_parent", default=None)


@dataclass(frozen=True)
class TracingConfig:
    """Where spans go: an OTLP/HTTP (protobuf) traces URL, e.g. http://collector:4318/v1/traces;
    "" is off. `service_name` (pdserve-router, pdserve-prefill, pdserve-decode) and `instance_id`
    (the worker id) name the process in the trace."""

    endpoint: str = ""
    service_name: str = "pdserve"
    instance_id: str = ""

    def __post_init__(self) -> None:
        url = urlparse(self.endpoint)
        if self.endpoint and (url.scheme not in ("http", "https") or not url.netloc):
            raise ValueError(f"OTLP traces endpoint {self.endpoint!r} must be an OTLP/HTTP URL, "
                             "e.g. http://127.0.0.1:4318/v1/traces")


def configure(config: TracingConfig) -> bool:
    """Exports this process's spans to `config.endpoint` in batches (OTEL_BSP_* tune them) until
    the process exits; does nothing without an endpoint. True when tracing is on."""
    if not config.endpoint:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    start(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint)), config.service_name, config.instance_id)
    return True


def start(processor, service_name: str, instance_id: str = "") -> None:
    """Turns tracing on with an opentelemetry `SpanProcessor` (tests: a SimpleSpanProcessor over an
    InMemorySpanExporter). The provider is this module's, not the global one."""
    global _tracer, _provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    attributes = {"service.name": service_name} | ({"service.instance.id": instance_id} if instance_id else {})
    _provider = TracerProvider(resource=Resource.create(attributes))
    _provider.add_span_processor(processor)
    _tracer = _provider.get_tracer("pdserve")


def stop() -> None:
    """Exports what is buffered and turns tracing off."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


# ---- router ------------------------------------------------------------------------------------
class _NoOp:
    """Every hook's answer while tracing is off."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def phase(self, name: str, worker_id: str) -> "_NoOp":
        return self

    def placed(self, path: str) -> None:
        pass

    def end(self, outcome: str, code: int, timings=None) -> None:
        pass

    def decoded(self, chunk) -> None:
        pass


NO_TRACE = _NoOp()


class RequestTrace:
    """The root span of one request at the router; `phase` opens its children."""

    def __init__(self, request_id: str, num_prompt_tokens: int):
        self.span = _tracer.start_span("request", attributes={"pdserve.request_id": request_id,
                                                              "pdserve.prompt_tokens": num_prompt_tokens})

    def phase(self, name: str, worker_id: str) -> "_Phase":
        """A child span around one attempt at phase `name` ("prefill", "decode") on `worker_id`; the
        worker RPCs this task sends from now on carry it as their parent."""
        return _Phase(_tracer.start_span(name, context=_as_parent(self.span),
                                         attributes={"pdserve.worker_id": worker_id}))

    def placed(self, path: str) -> None:
        self.span.set_attribute("pdserve.path", path)

    def end(self, outcome: str, code: int, timings=None) -> None:
        """Ends the root span with the request's outcome and HTTP status (`router.outcomes`), and
        what a served request's `pdserve.timings.Timings` says."""
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attributes({"pdserve.outcome": outcome, "http.response.status_code": code})
        if timings is not None:
            self.span.set_attributes({
                "pdserve.path": "disaggregated" if timings.disaggregated else "local",
                "pdserve.output_tokens": timings.output_tokens, "pdserve.ttft_s": timings.ttft_s,
                "pdserve.e2e_s": timings.e2e_s, "pdserve.kv_transfer_bytes": timings.kv_transfer_bytes})
        if outcome == "failed":
            self.span.set_status(Status(StatusCode.ERROR, f"HTTP {code}"))
        self.span.end()


def request_trace(request_id: str, num_prompt_tokens: int) -> RequestTrace | _NoOp:
    """The request's root span, or `NO_TRACE` while tracing is off."""
    return NO_TRACE if _tracer is None else RequestTrace(request_id, num_prompt_tokens)


class _Phase:
    """A span that ends when its `with` block does: with the error's name when one ends it (a
    worker's failure: the attempt is retried elsewhere; a cancel: the client left)."""

    def __init__(self, span):
        self.span = span

    def __enter__(self) -> "_Phase":
        _rpc_parent.set(self.span)   # per task, never reset: the next phase replaces it
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            code = getattr(error, "code", None)
            self.span.set_status(Status(StatusCode.ERROR, getattr(code, "name", None) or kind.__name__))
        self.span.end()
        return False

    def decoded(self, chunk) -> None:
        """Records the decode worker's KV pull from the final chunk (`pdserve.worker_api.DecodeChunk`):
        attributes of this span and a `kv_transfer` child span. The connector reports how long the
        pull took, not when it began: the child starts after the chunk's engine queue time (vLLM
        loads a request's KV when it first schedules it)."""
        if not (chunk.kv_transfer_bytes or chunk.kv_load_error):
            return
        start_ns = self.span.start_time + int(chunk.queued_s * 1e9)
        attributes = {"pdserve.kv.bytes": chunk.kv_transfer_bytes, "pdserve.kv.blocks": chunk.kv_transfer_blocks,
                      "pdserve.kv.seconds": chunk.kv_transfer_s, "pdserve.kv.loaded_tokens": chunk.kv_loaded_tokens}
        if chunk.kv_load_error:
            attributes["pdserve.kv.load_error"] = chunk.kv_load_error
        self.span.set_attributes(attributes)
        transfer = _tracer.start_span("kv_transfer", context=_as_parent(self.span), start_time=start_ns,
                                      attributes=attributes)
        if chunk.kv_load_error:
            from opentelemetry.trace import Status, StatusCode

            transfer.set_status(Status(StatusCode.ERROR, chunk.kv_load_error))
        transfer.end(end_time=start_ns + int(chunk.kv_transfer_s * 1e9))


def _as_parent(span):
    from opentelemetry.trace import set_span_in_context

    return set_span_in_context(span)


# ---- gRPC edges ---------------------------------------------------------------------------------
def client_interceptors() -> list:
    """What a router's `grpc.aio` channel to a worker gets: none while tracing is off, else
    interceptors putting the `traceparent` of the task's current phase in each call's metadata."""
    return [] if _tracer is None else [_UnaryTraceparent(), _StreamTraceparent()]


def _with_traceparent(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    extra = outgoing_metadata()
    return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), *extra)) if extra else details


class _UnaryTraceparent(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(_with_traceparent(client_call_details), request)


class _StreamTraceparent(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(_with_traceparent(client_call_details), request)


def outgoing_metadata() -> list[tuple[str, str]]:
    """The W3C trace context of the task's current phase, as gRPC metadata ([] outside one)."""
    span = _rpc_parent.get()
    if span is None:
        return []
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=_as_parent(span))
    return list(carrier.items())


def worker_span(name: str, context, request_id: str) -> _Phase | _NoOp:
    """A worker's span for one RPC (`name`: "prefill", "decode"), the child of the router's span
    named by the call's `traceparent` (`context`: the servicer's `grpc.aio.ServicerContext`); a root
    span when the call carries none. `NO_TRACE` while tracing is off."""
    if _tracer is None:
        return NO_TRACE
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(dict(context.invocation_metadata() or ()))
    return _Phase(_tracer.start_span(name, context=parent, attributes={"pdserve.request_id": request_id}))
