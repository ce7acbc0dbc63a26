"""A real local OpenAI-style streaming server for the load generator's tests (FastAPI + uvicorn
on a port the OS picks, in a background thread). `/v1/completions` streams `max_tokens` completion
chunks, the first after TTFT_S and the rest ITL_S apart, then a usage chunk and `data: [DONE]`;
`/v1/chat/completions` does the same for `max_completion_tokens`, after an opening role-only
chunk (as vLLM's server sends). Prompt tokens in usage: the id count, or whitespace-split words
of a text prompt / the messages' contents.

Special lengths select failure modes, so a test can place them in its workload:
- max_tokens == FAIL_TOKENS: HTTP 500 with an OpenAI error body;
- max_tokens == STALL_TOKENS: one chunk, then silence for STALL_S (the client times out);
- max_tokens == BROKEN_TOKENS: one chunk, then an error event in the stream.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

TTFT_S = 0.05
ITL_S = 0.01
FAIL_TOKENS = 13
REFUSE_TOKENS = 23
STALL_TOKENS = 17
BROKEN_TOKENS = 19
STALL_S = 5.0
MODEL = "test-model"


def _event(payload: dict | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def _chunk(text: str) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def _chat_chunk(delta: dict) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def _prompt_tokens(body: dict) -> int:
    if "messages" in body:
        return sum(len(m["content"].split()) for m in body["messages"])
    prompt = body["prompt"]
    return len(prompt.split()) if isinstance(prompt, str) else len(prompt)


class ServerState:
    """What the server saw: every request body, and the most streams it served at once."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def enter(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(state, await request.json(), body_key="max_tokens", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(state, await request.json(), body_key="max_completion_tokens", chat=True)

    return app


async def _serve(state: ServerState, body: dict, body_key: str, chat: bool):
    state.received.append(body)
    if body[body_key] == FAIL_TOKENS:
        return JSONResponse({"error": {"message": "injected failure", "type": "InternalError"}}, status_code=500)
    if body[body_key] == REFUSE_TOKENS:
        return JSONResponse({"error": {"message": "overloaded", "type": "overloaded"}}, status_code=429,
                            headers={"Retry-After": "3"})

    async def stream():
        state.enter()
        try:
            async for event in _events(body, body[body_key], chat):
                yield event
        finally:
            state.in_flight -= 1

    return StreamingResponse(stream(), media_type="text/event-stream")


async def _events(body: dict, max_tokens: int, chat: bool):
    chunk = (lambda text: _chat_chunk({"content": text})) if chat else _chunk
    await asyncio.sleep(TTFT_S)
    if chat:
        yield _event(_chat_chunk({"role": "assistant", "content": ""}))
    yield _event(chunk("t0"))
    if max_tokens == STALL_TOKENS:
        await asyncio.sleep(STALL_S)
    if max_tokens == BROKEN_TOKENS:
        yield _event({"error": {"message": "injected stream error", "code": 500}})
        return
    for i in range(1, max_tokens):
        await asyncio.sleep(ITL_S)
        yield _event(chunk(f" t{i}"))
    prompt_tokens = _prompt_tokens(body)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens}
    yield _event({"id": "cmpl-1", "object": "text_completion", "model": MODEL, "choices": [], "usage": usage})
    yield _event("[DONE]")


class SSEServer:
    """`with SSEServer() as server:` serves on server.url until the block ends."""

    def __init__(self) -> None:
        self.state = ServerState()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.state), log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> SSEServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test SSE server did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
