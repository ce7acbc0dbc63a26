"""An `Overloaded` refusal reaches clients with its retry time: HTTP 429 with `Retry-After`
(whole seconds, rounded up) and gRPC RESOURCE_EXHAUSTED with `retry-after-s`, which the SDK's
`Overloaded` carries back. Real servers on loopback; the lifecycle is a stand-in that refuses."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import httpx
import pytest

from pdserve.client import AsyncClient, Overloaded
from pdserve.errors import retry_after_header
from pdserve.v1 import generation_pb2_grpc
from router.grpc_api import GenerationService
from router.http_api import create_app
from router.lifecycle import RouterConfig


class RefusingLifecycle:
    """Admission says no, with a predicted drain time, before any work is done."""

    def __init__(self, retry_after_s: float | None):
        self.retry_after_s = retry_after_s
        self.inflight = 0
        self.config = RouterConfig(max_model_len=256)   # what the HTTP API reads: the context, for max_tokens
        self.tokenizer = SimpleNamespace(hf=None)   # a token-id prompt reads a tokenizer only to truncate it

    def admit(self, request) -> None:
        raise Overloaded("predicted TTFT 4.2 s misses the 1.5 s SLO", retry_after_s=self.retry_after_s)

    async def generate(self, request, admitted: bool = False):
        self.admit(request)
        yield  # pragma: no cover  (an async generator that refuses at its first step)


def test_retry_after_is_whole_seconds_rounded_up_and_absent_when_unknown():
    assert retry_after_header(Overloaded("x", retry_after_s=2.2)) == {"Retry-After": "3"}
    assert retry_after_header(Overloaded("x", retry_after_s=0.05)) == {"Retry-After": "1"}
    assert retry_after_header(Overloaded("x")) == {}


async def test_http_refusal_is_429_with_retry_after_and_an_openai_error_body():
    app = create_app(RefusingLifecycle(2.2), "tiny")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
        reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4})
    assert reply.status_code == 429
    assert reply.headers["retry-after"] == "3"
    assert reply.json()["error"]["type"] == "overloaded"


@pytest.mark.parametrize("retry_after_s", [2.2, None])
async def test_grpc_refusal_is_resource_exhausted_and_the_sdk_carries_the_retry_time(retry_after_s):
    server = grpc.aio.server()
    generation_pb2_grpc.add_GenerationServicer_to_server(GenerationService(RefusingLifecycle(retry_after_s), "tiny"),
                                                         server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            with pytest.raises(Overloaded) as refused:
                async for _ in client.generate(token_ids=[5, 6, 7], max_tokens=4):
                    pass
        assert refused.value.retry_after_s == (pytest.approx(2.2) if retry_after_s else None)
    finally:
        await server.stop(grace=None)
        await asyncio.sleep(0)
