"""`WorkerClient` over gRPC: the router's only user of `pdserve.v1.worker_pb2`/`worker_pb2_grpc`.

One instance per worker address, owning one channel that every request to that worker reuses.
With the cluster secret, every call carries a fresh proof of it (`pdserve.rpc_auth`), made for
`address`, which is the worker's advertised gRPC address; without one, calls go unsigned (warned
once) and a worker that has a secret refuses them (UNAUTHENTICATED).
Every `grpc.aio.AioRpcError` becomes `router.worker_client.WorkerError` with the same status code;
a prefill reply whose KV handle is malformed is the worker's fault (INTERNAL).
"""

from __future__ import annotations

from typing import AsyncIterator

import grpc

from pdserve import tracing
from pdserve.errors import InvalidRequest
from pdserve.rpc_auth_grpc import client_interceptors
from pdserve.rpc_keepalive import client_options
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillRequest, PrefillResult
from pdserve.worker_proto import (decode_chunk_from_proto, decode_request_to_proto, prefill_request_to_proto,
                                  prefill_result_from_proto)
from router.worker_client import WorkerError

RELEASE_TIMEOUT_S = 5.0


class GrpcWorkerClient:
    def __init__(self, address: str, release_timeout_s: float = RELEASE_TIMEOUT_S, secret: bytes | None = None):
        self.address = address
        self.release_timeout_s = release_timeout_s
        self._channel = grpc.aio.insecure_channel(address, options=client_options(),   # a vanished worker: UNAVAILABLE
                                                  interceptors=[*client_interceptors(secret, address),
                                                                *tracing.client_interceptors()])
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)

    async def prefill(self, request: PrefillRequest, timeout_s: float) -> PrefillResult:
        try:
            reply = await self._stub.Prefill(prefill_request_to_proto(request), timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise _worker_error(error) from None
        try:
            return prefill_result_from_proto(reply)
        except InvalidRequest as bad_handle:
            raise WorkerError(grpc.StatusCode.INTERNAL, f"{self.address} sent a bad KV handle: {bad_handle}") from None

    async def decode(self, request: DecodeRequest, timeout_s: float) -> AsyncIterator[DecodeChunk]:
        call = self._stub.Decode(decode_request_to_proto(request), timeout=timeout_s)
        try:
            async for reply in call:
                yield decode_chunk_from_proto(reply)
        except grpc.aio.AioRpcError as error:
            raise _worker_error(error) from None
        finally:
            call.cancel()

    async def release(self, transfer_id: str, request_id: str) -> bool:
        try:
            reply = await self._stub.Abort(
                worker_pb2.WorkerAbortRequest(request_id=request_id, transfer_id=transfer_id),
                timeout=self.release_timeout_s)
        except grpc.aio.AioRpcError as error:
            raise _worker_error(error) from None
        return reply.found

    async def close(self) -> None:
        await self._channel.close()


def _worker_error(error: grpc.aio.AioRpcError) -> WorkerError:
    return WorkerError(error.code(), error.details() or "")
