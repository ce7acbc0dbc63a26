"""API keys at the router's public edges: an ASGI middleware for HTTP and a gRPC server
interceptor, both refusing a call without a configured key before any handler runs (so before
tokenizing, admission, or any worker). What a key is and how it is compared: `router.public_access`.

    HTTP: `Authorization: Bearer <key>` on every path but OPEN_HTTP_PATHS (/health and /metrics,
          for probes and Prometheus, as vLLM leaves them); else 401, OpenAI's error body and
          `WWW-Authenticate: Bearer`.
    gRPC: metadata `authorization: Bearer <key>` on every method but grpc.health.v1's (kubelet's
          gRPC probe cannot send metadata); else UNAUTHENTICATED.

Refusals are counted in `pdserve_unauthenticated_requests_total{api}` and logged at most once
every REFUSAL_LOG_EVERY_S with a count, so a flood of strangers costs one line, not one each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from fastapi.responses import JSONResponse

from pdserve import metrics
from pdserve.errors import Unauthenticated, http_status
from pdserve.rpc_auth_grpc import refusing_handler
from router.openai_errors import error_body
from router.public_access import ApiKeys, bearer_token, exposure_problem
from router.public_tls import TlsFiles

logger = logging.getLogger("pdserve.router")

OPEN_HTTP_PATHS = frozenset({"/health", "/metrics"})
OPEN_GRPC_PREFIX = "/grpc.health.v1.Health/"
REFUSAL_LOG_EVERY_S = 10.0
HOW_TO_AUTHENTICATE = {
    "http": "a missing or wrong API key: send the header `Authorization: Bearer <key>`",
    "grpc": "a missing or wrong API key: send the metadata `authorization: Bearer <key>` (pdserve.client.Client(api_key=...))",
}


@dataclass(frozen=True)
class PublicApiConfig:
    """How the router's public ports are protected. `api_keys` empty: the API is open (fine on
    loopback; elsewhere `exposure_problem` asks for --insecure)."""

    tls: TlsFiles = TlsFiles()
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    insecure: bool = False   # the operator accepts listening beyond loopback without TLS or keys

    def problem_at(self, host: str) -> str | None:
        return exposure_problem(host, tls=self.tls.enabled, api_keys=bool(self.api_keys), insecure=self.insecure)


class _Refusals:
    """Counts refusals and logs them, rate-limited."""

    def __init__(self, api: str, clock: Callable[[], float] = time.monotonic):
        self.api, self.clock = api, clock
        self.num_refused = 0
        self._unlogged = 0
        self._last_logged_s = -REFUSAL_LOG_EVERY_S

    def refused(self, what: str) -> None:
        self.num_refused += 1
        self._unlogged += 1
        metrics.UNAUTHENTICATED.labels(self.api).inc()
        now_s = self.clock()
        if now_s - self._last_logged_s >= REFUSAL_LOG_EVERY_S:
            logger.warning("refused %d %s call(s) without a valid API key, the latest to %s",
                           self._unlogged, self.api, what)
            self._last_logged_s, self._unlogged = now_s, 0


class ApiKeyMiddleware:
    """Pure ASGI middleware (streaming responses pass through untouched)."""

    def __init__(self, app, keys: ApiKeys):
        self.app, self.keys = app, keys
        self.refusals = _Refusals("http")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_HTTP_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        presented = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        if self.keys.accepts(presented):
            return await self.app(scope, receive, send)
        self.refusals.refused(scope["path"])
        error = Unauthenticated(HOW_TO_AUTHENTICATE["http"])
        response = JSONResponse(error_body(error), status_code=http_status(error), headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: ApiKeys):
        self.keys = keys
        self.refusals = _Refusals("grpc")

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)  # a lookup only: no servicer code runs
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_GRPC_PREFIX):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        if self.keys.accepts(bearer_token(metadata.get("authorization"))):
            return handler
        self.refusals.refused(method)
        return refusing_handler(handler, HOW_TO_AUTHENTICATE["grpc"])


def grpc_interceptors(config: PublicApiConfig) -> list[grpc.aio.ServerInterceptor]:
    return [ApiKeyInterceptor(ApiKeys(config.api_keys))] if config.api_keys else []


def http_app(app, config: PublicApiConfig):
    """`app` behind the API key check when keys are configured."""
    return ApiKeyMiddleware(app, ApiKeys(config.api_keys)) if config.api_keys else app


def warn_if_exposed(host: str, config: PublicApiConfig) -> None:
    """One warning when --insecure lets the API listen beyond loopback without TLS or keys."""
    if config.insecure and exposure_problem(host, tls=config.tls.enabled, api_keys=bool(config.api_keys),
                                            insecure=False):
        missing = " and ".join(what for what, on in (("TLS", config.tls.enabled), ("API keys", config.api_keys)) if not on)
        logger.warning("the public API listens on %s without %s (--insecure): whatever is in front of the router "
                       "must authenticate clients and protect the traffic", host or "every interface", missing)
