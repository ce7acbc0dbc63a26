"""pdserve's gRPC API through the SDK (`pdserve.client.AsyncClient`), imported when opened so the
load generator runs against HTTP servers on hosts without pdserve's client dependencies.

SDK shape relied on: `AsyncClient(target)`; `client.generate(token_ids=..., max_tokens=...,
temperature=..., ignore_eos=True)` is an async iterator of chunks with `.token_ids: list[int]`
and `.text: str`; the last chunk has `.finished=True` and `.timings` (queued_s, prefill_s,
kv_transfer_s, kv_bytes, decode_s). gRPC errors arrive as exceptions carrying a status code.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

from loadgen.prompts import Prompt
from loadgen.targets.base import Delta, PhaseTimings, TargetError


class PdserveGrpcTarget:
    """`address` is the router's gRPC address, e.g. 127.0.0.1:50051."""

    name = "pdserve"

    def __init__(self, address: str, temperature: float = 0.0) -> None:
        if "://" in address:
            raise ValueError(f"a gRPC address is host:port without a scheme, got {address!r}")
        self.address = address
        self.temperature = temperature
        self._client: Any = None

    async def open(self) -> None:
        from pdserve.client import AsyncClient  # lazy: only pdserve targets need the SDK

        self._client = AsyncClient(self.address)

    async def close(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            result = close()
            if inspect.isawaitable(result):
                await result
        self._client = None

    async def generate(self, prompt: Prompt) -> AsyncIterator[Delta]:
        if self._client is None:
            raise RuntimeError("call open() before generate()")
        stream = self._client.generate(
            token_ids=list(prompt.token_ids),
            max_tokens=prompt.max_tokens,
            temperature=self.temperature,
            ignore_eos=True,
        )
        try:
            async for chunk in stream:
                yield chunk_to_delta(chunk)
        except Exception as failure:
            status = _grpc_status(failure)
            if status is None:
                raise  # not a gRPC status: the runner records it as is
            raise TargetError(status, _grpc_details(failure)) from failure
        finally:  # a timed-out or abandoned request cancels its RPC, freeing the server's resources
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


def chunk_to_delta(chunk: Any) -> Delta:
    """An SDK chunk -> Delta: content when it carries tokens or text; phases on the final chunk."""
    token_ids = list(getattr(chunk, "token_ids", None) or [])
    text = getattr(chunk, "text", "") or ""
    timings = getattr(chunk, "timings", None) if getattr(chunk, "finished", False) else None
    phases = None
    if timings is not None:
        phases = PhaseTimings(
            queued_s=float(timings.queued_s),
            prefill_s=float(timings.prefill_s),
            kv_transfer_s=float(timings.kv_transfer_s),
            kv_bytes=int(timings.kv_bytes),
            decode_s=float(timings.decode_s),
        )
    return Delta(content=bool(token_ids or text), text=text, num_tokens=len(token_ids), phases=phases)


def _grpc_status(failure: Exception) -> str | None:
    """The status code name of a gRPC error (`grpc.aio.AioRpcError.code()`), else None."""
    code = getattr(failure, "code", None)
    if not callable(code):
        return None
    status = code()
    return getattr(status, "name", str(status))


def _grpc_details(failure: Exception) -> str:
    details = getattr(failure, "details", None)
    return str(details()) if callable(details) else str(failure)
