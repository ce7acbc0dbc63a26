"""The gRPC side of `pdserve.rpc_auth`: a server interceptor that refuses unproven calls with
UNAUTHENTICATED before any handler runs, and client interceptors that sign every call.

Thin by design: what a token is and when it is accepted are `pdserve.rpc_auth`'s pure functions.
Without a secret both sides pass calls through unchanged and warn once per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from pdserve.rpc_auth import EXEMPT_METHODS, HEADER, ReplayCache, check, make_token

logger = logging.getLogger(__name__)

REFUSAL_LOG_EVERY_S = 10.0      # a flood of unproven calls logs one line per this, with a count
_warned: set[str] = set()
_lock = threading.Lock()


def warn_if_unauthenticated(secret: bytes | None, side: str) -> None:
    """Logs once per process and side that worker gRPC runs without the cluster secret."""
    if secret is not None:
        return
    with _lock:
        if side in _warned:
            return
        _warned.add(side)
    logger.warning("worker gRPC is unauthenticated (the %s has no cluster secret): anyone who can reach a worker's "
                   "gRPC port can send it Prefill and Decode; start routers and workers with --cluster-secret-file "
                   "(pdserve up does)", side)


class WorkerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Accepts a call to any method but `EXEMPT_METHODS` only with a fresh, unused proof of `secret`
    made for one of `audiences` (the worker's advertised gRPC address: set it once the port is
    bound, before the server starts; until then every call is refused)."""

    def __init__(self, secret: bytes, audiences: frozenset[str] = frozenset(),
                 clock: Callable[[], float] = time.time, replay: ReplayCache | None = None):
        self.secret = secret
        self.audiences = audiences
        self.clock = clock
        self.replay = replay or ReplayCache()
        self.num_refused = 0
        self._last_logged_s = -REFUSAL_LOG_EVERY_S
        self._unlogged = 0

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)  # a lookup only: no servicer code runs
        method = handler_call_details.method
        if handler is None or method in EXEMPT_METHODS:
            return handler
        offered = dict(handler_call_details.invocation_metadata or ()).get(HEADER)
        now_s = self.clock()
        verdict = check(self.secret, self.audiences, method, offered, now_s)
        if verdict.accepted and self.replay.first_use(verdict.nonce, verdict.expires_at_s, now_s):
            return handler
        return self._refuse(handler, method, verdict.why or "a replayed proof (its nonce was used already)", now_s)

    def _refuse(self, handler: grpc.RpcMethodHandler, method: str, why: str, now_s: float) -> grpc.RpcMethodHandler:
        self.num_refused += 1
        self._unlogged += 1
        if now_s - self._last_logged_s >= REFUSAL_LOG_EVERY_S:
            logger.warning("refused %d unauthenticated worker call(s), the latest to %s: %s", self._unlogged, method, why)
            self._last_logged_s, self._unlogged = now_s, 0
        return refusing_handler(handler, f"worker gRPC needs the cluster's credentials: {why}")


def refusing_handler(handler: grpc.RpcMethodHandler, details: str) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s shape that aborts with UNAUTHENTICATED (the request stays bytes)."""

    async def refuse(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


def server_interceptors(secret: bytes | None, audiences: frozenset[str] = frozenset()) -> list[WorkerAuthInterceptor]:
    """What a worker's `grpc.aio.server(interceptors=...)` gets: none without a secret (warned)."""
    warn_if_unauthenticated(secret, "worker")
    return [] if secret is None else [WorkerAuthInterceptor(secret, audiences)]


class _Signer:
    """Adds a fresh proof of `secret` for the worker at `audience` to every call."""

    def __init__(self, secret: bytes, audience: str, clock: Callable[[], float] = time.time):
        self.secret, self.audience, self.clock = secret, audience, clock

    def _signed(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        proof = (HEADER, make_token(self.secret, self.audience, method, self.clock()))
        return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), proof))


class SigningInterceptor(_Signer, grpc.aio.UnaryUnaryClientInterceptor):
    """Signs unary calls (Prefill, Abort, GetLoad). A `grpc.aio` channel files each interceptor
    under one kind only, so streams need `StreamSigningInterceptor` beside it."""

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._signed(client_call_details), request)


class StreamSigningInterceptor(_Signer, grpc.aio.UnaryStreamClientInterceptor):
    """Signs server-streaming calls (Decode)."""

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._signed(client_call_details), request)


def client_interceptors(secret: bytes | None, audience: str) -> list[_Signer]:
    """What a `grpc.aio` channel to the worker at `audience` gets: none without a secret (warned)."""
    warn_if_unauthenticated(secret, "router")
    return [] if secret is None else [SigningInterceptor(secret, audience), StreamSigningInterceptor(secret, audience)]


class SyncSigningInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """`SigningInterceptor` for synchronous channels (tools, tests, benchmarks)."""

    def __init__(self, secret: bytes, audience: str, clock: Callable[[], float] = time.time):
        self.secret, self.audience, self.clock = secret, audience, clock

    def _signed(self, details):
        proof = (HEADER, make_token(self.secret, self.audience, details.method, self.clock()))
        return details._replace(metadata=(*(details.metadata or ()), proof))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._signed(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._signed(client_call_details), request)


def worker_channel(address: str, secret: bytes | None) -> grpc.Channel:
    """A synchronous channel to the worker at `address` whose calls carry proofs of `secret`."""
    channel = grpc.insecure_channel(address)
    return channel if secret is None else grpc.intercept_channel(channel, SyncSigningInterceptor(secret, address))


__all__ = ["SigningInterceptor", "StreamSigningInterceptor", "SyncSigningInterceptor", "WorkerAuthInterceptor", "client_interceptors",
           "server_interceptors", "warn_if_unauthenticated", "worker_channel"]
