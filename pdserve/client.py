"""The pdserve client SDK.

    from pdserve.client import Client
    with Client("127.0.0.1:50051") as client:
        for chunk in client.generate("Hello", max_tokens=32, temperature=0):
            print(chunk.text, end="")
        print(chunk.timings)        # the last chunk carries per-phase timings

`AsyncClient` has the same methods as coroutines / async iterators. Errors are typed
(`InvalidRequest`, `Unauthenticated`, `Overloaded`, `NoHealthyWorker`, `Cancelled`,
`DeadlineExceeded`, `InternalError`, all `ServeError`), whatever the transport said.

A router that requires API keys and TLS (SECURITY.md):

    Client("router.example:50051", api_key=os.environ["PDSERVE_API_KEY"], tls=True)
    Client("10.0.0.7:50051", api_key=key, root_certificates=open("server.pem", "rb").read())

`tls=True` trusts the system's CAs; `root_certificates` (PEM bytes) trusts those instead and
implies TLS; `client_certificate` and `client_key` (PEM bytes) answer a router requiring mTLS.
The key travels as the metadata `authorization: Bearer <key>` on every call.

Retries. `generate` is retried only when the router never answered (UNAVAILABLE from the
transport: a router restarting, a connection reset) and no chunk had arrived: then nothing was sent
to the caller and a new call cannot duplicate output. Any answer of the router's (its errors carry
`pdserve-error` metadata), and any failure after the first chunk, is raised at once. Retries go on
for `retry_budget_s` (15 s, longer than a router restart) with jittered backoff, 0.25 s doubling to
2 s; `retries` adds a count limit; `timeout_s` bounds the whole call, retries included
(`pdserve.retry`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Sequence

import grpc

from pdserve.errors import (  # re-exported for users: __all__
    Cancelled,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    NoHealthyWorker,
    RETRY_AFTER_METADATA,
    Overloaded,
    ServeError,
    Unauthenticated,
    from_grpc_code,
)
from pdserve.generation import GenerationChunk  # re-exported: the SDK's chunk type
from pdserve.logprobs import positions_from_proto
from pdserve.retry import (
    DEFAULT_RETRY_BUDGET_S,
    RetryPolicy,
    attempt_timeout_s,
    may_retry,
    next_retry_delay_s,
    retry_delay_s,
)
from pdserve.timings import Timings
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

__all__ = ["AsyncClient", "Client", "ModelInfo", "GenerationChunk", "RetryPolicy", "DEFAULT_RETRY_BUDGET_S",
           "may_retry", "retry_delay_s", "build_request", "ServeError", "InvalidRequest", "Unauthenticated",
           "Overloaded", "NoHealthyWorker", "Cancelled", "DeadlineExceeded", "InternalError"]


@dataclass(frozen=True)
class ModelInfo:
    model: str
    max_model_len: int
    vocab_size: int
    num_prefill_workers: int
    num_decode_workers: int


def build_request(prompt: str | None, token_ids: Sequence[int] | None, request_id: str, slo_class: str,
                  truncate_prompt_tokens: int | None = None, cache_salt: str = "", **sampling) -> pb.GenerateRequest:
    """`bad_words` is a list of words (vLLM's); `truncate_prompt_tokens` keeps the prompt's last
    tokens (-1: as many as the context holds), as vLLM's server truncates a prompt; `cache_salt`
    (non-empty) salts the prefix cache, so only requests with the same salt share cached blocks."""
    if (prompt is None) == (token_ids is None):
        raise InvalidRequest("give exactly one of prompt (text) or token_ids", field="prompt")
    stop = sampling.pop("stop", None)
    bad_words = sampling.pop("bad_words", None)
    params = pb.SamplingParams(**{k: v for k, v in sampling.items() if v is not None})
    params.stop.extend([stop] if isinstance(stop, str) else list(stop or ()))
    params.bad_words.extend([bad_words] if isinstance(bad_words, str) else list(bad_words or ()))
    request = pb.GenerateRequest(sampling=params, request_id=request_id, slo_class=slo_class, cache_salt=cache_salt)
    if truncate_prompt_tokens is not None:
        request.truncate_prompt_tokens = truncate_prompt_tokens
    if prompt is not None:
        request.text = prompt
    else:
        request.token_ids.ids.extend(token_ids)
    return request


def _chunk(message: pb.GenerateResponse) -> GenerationChunk:
    timings = Timings.from_proto(message.timings) if message.HasField("timings") else None
    return GenerationChunk(message.request_id, list(message.token_ids), message.text, message.finished,
                           message.finish_reason, timings, logprobs=positions_from_proto(message.logprobs),
                           prompt_logprobs=positions_from_proto(message.prompt_logprobs) or None)


class _RetryClock:
    """One `generate` call's attempts: the timeout each gets and the wait before the next."""

    def __init__(self, policy: RetryPolicy, timeout_s: float | None):
        self.policy, self.timeout_s = policy, timeout_s
        self.started_at, self.retries_done = time.monotonic(), 0

    def attempt_timeout_s(self) -> float | None:
        return attempt_timeout_s(self.timeout_s, time.monotonic() - self.started_at)

    def delay_s(self, error: grpc.RpcError, chunks_received: int) -> float | None:
        """The wait before sending the call again, or None: raise `error`."""
        keys = frozenset(key for key, _ in (error.trailing_metadata() or ()))
        if not may_retry(error.code(), keys, chunks_received):
            return None
        delay_s = next_retry_delay_s(self.policy, self.retries_done, time.monotonic() - self.started_at,
                                     self.timeout_s, random.random())
        self.retries_done += 1
        return delay_s


# The channel reconnects at least as often as the SDK retries: gRPC's default backoff grows to
# 120 s, and a channel waiting out its backoff fails every call at once, even with the router back.
_CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", int(RetryPolicy().base_delay_s * 1000)),
                    ("grpc.max_reconnect_backoff_ms", int(RetryPolicy().max_delay_s * 1000)))


def _typed(error: grpc.RpcError) -> ServeError:
    """The typed error of a failed call; an `Overloaded` carries the router's `retry_after_s`."""
    typed = from_grpc_code(error.code(), error.details() or str(error.code()))
    if isinstance(typed, Overloaded):
        trailing = dict(error.trailing_metadata() or ())
        if RETRY_AFTER_METADATA in trailing:
            typed.retry_after_s = float(trailing[RETRY_AFTER_METADATA])
    return typed


def _channel_credentials(tls: bool, root_certificates: bytes | None, client_certificate: bytes | None,
                         client_key: bytes | None) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None for plaintext (none of the TLS arguments given)."""
    if (client_certificate is None) != (client_key is None):
        raise ValueError("mTLS takes both client_certificate and client_key (PEM bytes), or neither")
    if not (tls or root_certificates or client_certificate):
        return None
    return grpc.ssl_channel_credentials(root_certificates=root_certificates, private_key=client_key,
                                        certificate_chain=client_certificate)


def _call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {api_key}"),) if api_key else None


def _sampling_kwargs(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, min_tokens, penalties) -> dict:
    return dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                ignore_eos=ignore_eos, min_tokens=min_tokens, **penalties)


class AsyncClient:
    def __init__(self, target: str, *, api_key: str | None = None, tls: bool = False,
                 root_certificates: bytes | None = None, client_certificate: bytes | None = None,
                 client_key: bytes | None = None, retry_budget_s: float = DEFAULT_RETRY_BUDGET_S,
                 retries: int | None = None):
        self.target = target
        self.retry_policy = RetryPolicy(budget_s=retry_budget_s, max_retries=retries)
        credentials = _channel_credentials(tls, root_certificates, client_certificate, client_key)
        self._channel = (grpc.aio.insecure_channel(target, _CHANNEL_OPTIONS) if credentials is None
                         else grpc.aio.secure_channel(target, credentials, _CHANNEL_OPTIONS))
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._metadata = _call_metadata(api_key)

    async def generate(self, prompt: str | None = None, *, token_ids: Sequence[int] | None = None,
                       max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                       top_k: int | None = None, seed: int | None = None, stop: str | Sequence[str] | None = None,
                       ignore_eos: bool = False, min_tokens: int | None = None,
                       presence_penalty: float | None = None, frequency_penalty: float | None = None,
                       repetition_penalty: float | None = None, bad_words: Sequence[str] | None = None,
                       truncate_prompt_tokens: int | None = None, request_id: str = "",
                       slo_class: str = "", timeout_s: float | None = None,
                       cache_salt: str = "") -> AsyncIterator[GenerationChunk]:
        request = build_request(prompt, token_ids, request_id, slo_class, truncate_prompt_tokens, cache_salt,
                                **_sampling_kwargs(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, min_tokens,
                                                  dict(presence_penalty=presence_penalty,
                                                       frequency_penalty=frequency_penalty,
                                                       repetition_penalty=repetition_penalty, bad_words=bad_words)))
        clock = _RetryClock(self.retry_policy, timeout_s)
        while True:
            call = self._stub.Generate(request, timeout=clock.attempt_timeout_s(), metadata=self._metadata)
            received = 0
            try:
                async for message in call:
                    received += 1
                    yield _chunk(message)
                return
            except grpc.aio.AioRpcError as error:
                delay_s = clock.delay_s(error, received)
                if delay_s is None:
                    raise _typed(error) from None
            finally:
                call.cancel()
            await asyncio.sleep(delay_s)

    async def abort(self, request_id: str) -> bool:
        try:
            return (await self._stub.Abort(pb.AbortRequest(request_id=request_id), metadata=self._metadata)).found
        except grpc.aio.AioRpcError as error:
            raise _typed(error) from None

    async def model_info(self) -> ModelInfo:
        try:
            info = await self._stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _typed(error) from None
        return ModelInfo(info.model, info.max_model_len, info.vocab_size, info.num_prefill_workers,
                         info.num_decode_workers)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Client:
    """Blocking client: `generate` is an iterator; breaking out of it cancels the request. Takes
    the same connection arguments as `AsyncClient`."""

    def __init__(self, target: str, *, api_key: str | None = None, tls: bool = False,
                 root_certificates: bytes | None = None, client_certificate: bytes | None = None,
                 client_key: bytes | None = None, retry_budget_s: float = DEFAULT_RETRY_BUDGET_S,
                 retries: int | None = None):
        self.target = target
        self.retry_policy = RetryPolicy(budget_s=retry_budget_s, max_retries=retries)
        credentials = _channel_credentials(tls, root_certificates, client_certificate, client_key)
        self._channel = (grpc.insecure_channel(target, _CHANNEL_OPTIONS) if credentials is None
                         else grpc.secure_channel(target, credentials, _CHANNEL_OPTIONS))
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._metadata = _call_metadata(api_key)

    def generate(self, prompt: str | None = None, *, token_ids: Sequence[int] | None = None,
                 max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, seed: int | None = None, stop: str | Sequence[str] | None = None,
                 ignore_eos: bool = False, min_tokens: int | None = None,
                 presence_penalty: float | None = None, frequency_penalty: float | None = None,
                 repetition_penalty: float | None = None, bad_words: Sequence[str] | None = None,
                 truncate_prompt_tokens: int | None = None, request_id: str = "",
                 slo_class: str = "", timeout_s: float | None = None, cache_salt: str = "") -> Iterator[GenerationChunk]:
        request = build_request(prompt, token_ids, request_id, slo_class, truncate_prompt_tokens, cache_salt,
                                **_sampling_kwargs(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, min_tokens,
                                                  dict(presence_penalty=presence_penalty,
                                                       frequency_penalty=frequency_penalty,
                                                       repetition_penalty=repetition_penalty, bad_words=bad_words)))
        clock = _RetryClock(self.retry_policy, timeout_s)
        while True:
            call = self._stub.Generate(request, timeout=clock.attempt_timeout_s(), metadata=self._metadata)
            received = 0
            try:
                for message in call:
                    received += 1
                    yield _chunk(message)
                return
            except grpc.RpcError as error:
                delay_s = clock.delay_s(error, received)
                if delay_s is None:
                    raise _typed(error) from None
            finally:
                call.cancel()
            time.sleep(delay_s)

    def abort(self, request_id: str) -> bool:
        try:
            return self._stub.Abort(pb.AbortRequest(request_id=request_id), metadata=self._metadata).found
        except grpc.RpcError as error:
            raise _typed(error) from None

    def model_info(self) -> ModelInfo:
        try:
            info = self._stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=self._metadata)
        except grpc.RpcError as error:
            raise _typed(error) from None
        return ModelInfo(info.model, info.max_model_len, info.vocab_size, info.num_prefill_workers,
                         info.num_decode_workers)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
