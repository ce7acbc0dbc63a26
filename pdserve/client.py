"""The pdserve client SDK.

    from pdserve.client import Client
    with Client("127.0.0.1:50051") as client:
        for chunk in client.generate("Hello", max_tokens=32, temperature=0):
            print(chunk.text, end="")
        print(chunk.timings)        # the last chunk carries per-phase timings

`AsyncClient` has the same methods as coroutines / async iterators. Errors are typed
(`InvalidRequest`, `Overloaded`, `NoHealthyWorker`, `Cancelled`, `DeadlineExceeded`, `InternalError`,
all `ServeError`), whatever the transport said.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Sequence

import grpc

from pdserve.errors import (  # noqa: F401  (re-exported for users)
    Cancelled,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    NoHealthyWorker,
    RETRY_AFTER_METADATA,
    Overloaded,
    ServeError,
    from_grpc_code,
)
from pdserve.generation import GenerationChunk  # noqa: F401  (re-exported: the SDK's chunk type)
from pdserve.timings import Timings
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc


@dataclass(frozen=True)
class ModelInfo:
    model: str
    max_model_len: int
    vocab_size: int
    num_prefill_workers: int
    num_decode_workers: int


def build_request(prompt: str | None, token_ids: Sequence[int] | None, request_id: str, slo_class: str,
                  **sampling) -> pb.GenerateRequest:
    if (prompt is None) == (token_ids is None):
        raise InvalidRequest("give exactly one of prompt (text) or token_ids", field="prompt")
    stop = sampling.pop("stop", None)
    params = pb.SamplingParams(**{k: v for k, v in sampling.items() if v is not None})
    params.stop.extend([stop] if isinstance(stop, str) else list(stop or ()))
    request = pb.GenerateRequest(sampling=params, request_id=request_id, slo_class=slo_class)
    if prompt is not None:
        request.text = prompt
    else:
        request.token_ids.ids.extend(token_ids)
    return request


def _chunk(message: pb.GenerateResponse) -> GenerationChunk:
    timings = Timings.from_proto(message.timings) if message.HasField("timings") else None
    return GenerationChunk(message.request_id, list(message.token_ids), message.text, message.finished,
                           message.finish_reason, timings)


def _typed(error: grpc.RpcError) -> ServeError:
    """The typed error of a failed call; an `Overloaded` carries the router's `retry_after_s`."""
    typed = from_grpc_code(error.code(), error.details() or str(error.code()))
    if isinstance(typed, Overloaded):
        trailing = dict(error.trailing_metadata() or ())
        if RETRY_AFTER_METADATA in trailing:
            typed.retry_after_s = float(trailing[RETRY_AFTER_METADATA])
    return typed


def _sampling_kwargs(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, min_tokens) -> dict:
    return dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                ignore_eos=ignore_eos, min_tokens=min_tokens)


class AsyncClient:
    def __init__(self, target: str):
        self.target = target
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    async def generate(self, prompt: str | None = None, *, token_ids: Sequence[int] | None = None,
                       max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                       top_k: int | None = None, seed: int | None = None, stop: str | Sequence[str] | None = None,
                       ignore_eos: bool = False, min_tokens: int | None = None, request_id: str = "",
                       slo_class: str = "", timeout_s: float | None = None) -> AsyncIterator[GenerationChunk]:
        request = build_request(prompt, token_ids, request_id, slo_class,
                                **_sampling_kwargs(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, min_tokens))
        call = self._stub.Generate(request, timeout=timeout_s)
        try:
            async for message in call:
                yield _chunk(message)
        except grpc.aio.AioRpcError as error:
            raise _typed(error) from None
        finally:
            call.cancel()

    async def abort(self, request_id: str) -> bool:
        try:
            return (await self._stub.Abort(pb.AbortRequest(request_id=request_id))).found
        except grpc.aio.AioRpcError as error:
            raise _typed(error) from None

    async def model_info(self) -> ModelInfo:
        info = await self._stub.GetModelInfo(pb.GetModelInfoRequest())
        return ModelInfo(info.model, info.max_model_len, info.vocab_size, info.num_prefill_workers,
                         info.num_decode_workers)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Client:
    """Blocking client: `generate` is an iterator; breaking out of it cancels the request."""

    def __init__(self, target: str):
        self.target = target
        self._channel = grpc.insecure_channel(target)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    def generate(self, prompt: str | None = None, *, token_ids: Sequence[int] | None = None,
                 max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, seed: int | None = None, stop: str | Sequence[str] | None = None,
                 ignore_eos: bool = False, min_tokens: int | None = None, request_id: str = "",
                 slo_class: str = "", timeout_s: float | None = None) -> Iterator[GenerationChunk]:
        request = build_request(prompt, token_ids, request_id, slo_class,
                                **_sampling_kwargs(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, min_tokens))
        call = self._stub.Generate(request, timeout=timeout_s)
        try:
            for message in call:
                yield _chunk(message)
        except grpc.RpcError as error:
            raise _typed(error) from None
        finally:
            call.cancel()

    def abort(self, request_id: str) -> bool:
        try:
            return self._stub.Abort(pb.AbortRequest(request_id=request_id)).found
        except grpc.RpcError as error:
            raise _typed(error) from None

    def model_info(self) -> ModelInfo:
        info = self._stub.GetModelInfo(pb.GetModelInfoRequest())
        return ModelInfo(info.model, info.max_model_len, info.vocab_size, info.num_prefill_workers,
                         info.num_decode_workers)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
