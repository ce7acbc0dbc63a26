"""How the router talks to one worker: a small Protocol over `pdserve.worker_api` dataclasses.

The lifecycle (router/lifecycle.py) sees only this; `router.grpc_worker_client.GrpcWorkerClient` is
the real implementation (the only router module that touches the worker protobufs), and tests may
script their own to drive the lifecycle's decisions in-process.

Contract of every implementation:
- a worker's failed call raises `WorkerError` carrying the gRPC status code it answered with
  (`router.failures.verdict_for` decides what that means); nothing else is raised for a worker's failure;
- `timeout_s` is the call's deadline (for `decode`, of the whole stream), DEADLINE_EXCEEDED past it;
- closing a `decode` iterator early (`aclose()`) cancels the stream on the worker.
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol

import grpc

from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillRequest, PrefillResult


class WorkerError(Exception):
    """A worker answered a call with a failure status. `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, details: str = ""):
        super().__init__(f"{code.name}: {details}" if details else code.name)
        self.code = code
        self.details = details or code.name


class WorkerClient(Protocol):
    async def prefill(self, request: PrefillRequest, timeout_s: float) -> PrefillResult:
        """Runs the prompt; the result names the leased KV unless the request already finished."""
        ...

    def decode(self, request: DecodeRequest, timeout_s: float) -> AsyncIterator[DecodeChunk]:
        """Streams the request's tokens; the last chunk has `finished` set."""
        ...

    async def release(self, transfer_id: str, request_id: str) -> bool:
        """Aborts `request_id` there and frees the KV held for `transfer_id` (True if either was
        found). Safe to call for a transfer already pulled or never held."""
        ...

    async def close(self) -> None:
        ...
