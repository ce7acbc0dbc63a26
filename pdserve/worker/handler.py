"""The contract between the worker runtime (this package) and a role (prefill_worker/,
decode_worker/). The runtime owns the engine, the gRPC server, health, the registry lease and the
drain; a role handler owns what the worker does with a request.

A handler implements `RoleHandler` and the phase protocols of the RPCs it serves: a prefill worker
`Prefills`, a decode worker `Decodes` (a hybrid worker may serve both). The servicer answers an RPC
whose protocol the handler does not implement with FAILED_PRECONDITION, so no role stubs another's.

Handlers see dataclasses only (`pdserve.worker_api`): the servicer converts protobuf at the edge.
Handlers may raise `pdserve.errors.ServeError` (mapped to its status) or let vLLM's input errors
through (mapped to INVALID_ARGUMENT); anything else is the worker's fault (UNKNOWN), see
`pdserve.worker.server`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillRequest, PrefillResult

if TYPE_CHECKING:
    from pdserve.worker.server import WorkerRuntime


@runtime_checkable
class RoleHandler(Protocol):
    async def release(self, transfer_id: str) -> bool:
        """Frees the KV this worker holds for `transfer_id` for another worker; False if it holds
        none (never held, already pulled, or a role that holds none). Safe to call repeatedly."""
        ...


@runtime_checkable
class Prefills(Protocol):
    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Runs the prompt, returns its first token and the KV handle a decode worker pulls."""
        ...


@runtime_checkable
class Decodes(Protocol):
    def decode(self, request: DecodeRequest) -> AsyncIterator[DecodeChunk]:
        """Loads (or computes) the prompt's KV and streams the generated tokens; the last message
        is marked finished and carries the phase's report."""
        ...


HandlerFactory = Callable[["WorkerRuntime"], RoleHandler]
