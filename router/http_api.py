"""OpenAI-compatible HTTP API on the same request path as gRPC (`Lifecycle.generate`).

    POST /v1/completions, POST /v1/chat/completions (SSE when "stream": true)
    GET /v1/models, GET /health, GET /metrics
Request bodies and their meanings are vLLM's (`router.openai_schema`); a `model` other than the
served name is 404, as vLLM answers it. The text, stop strings included, is made by the lifecycle
(`router.output_text`), so HTTP and gRPC see the same. Errors use OpenAI's body, {"error":
{"message", "type", "param", "code"}}, with the status from `pdserve.errors`; an error after streaming began is sent as a final SSE event. Every completion
request is counted once in `pdserve_requests_total` (`router.outcomes`): by the error handlers when
it fails before its response starts, else when its response (or stream) ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdserve.errors import InternalError, InvalidRequest, ServeError, http_status, retry_after_header
from pdserve.generation import GenerationChunk
from router.lifecycle import Lifecycle
from router.openai_schema import ChatCompletionRequest, CompletionRequest
from router.outcomes import CANCELLED, INTERNAL, OK, count, outcome_of
from router.types import GenerationRequest

logger = logging.getLogger(__name__)


def error_body(error: ServeError) -> dict:
    return {"error": {"message": error.message, "type": error.kind, "param": error.field, "code": http_status(error)}}


def error_response(error: ServeError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=http_status(error), headers=retry_after_header(error))


def _validation_error(exc: RequestValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(location) or None
    reason = "unknown field" if first.get("type") == "extra_forbidden" else first.get("msg", "invalid value")
    return InvalidRequest(f"{field}: {reason}" if field else reason, field=field)


def create_app(lifecycle: Lifecycle, model_name: str) -> FastAPI:
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        error = _validation_error(exc)
        count("http", outcome_of(error))
        return error_response(error)

    @app.exception_handler(ServeError)
    async def on_serve_error(request: Request, exc: ServeError):
        count("http", outcome_of(exc))
        return error_response(exc)

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception):
        """A bug, not the client's doing: 500 with OpenAI's body (Starlette logs the traceback)."""
        count("http", INTERNAL)
        return error_response(InternalError("internal error"))

    @app.get("/health")
    async def health():
        """Liveness: 200 while the router runs; the body says whether it can serve right now."""
        pool = lifecycle.pool
        return {"status": "ok", "prefill_workers": len(pool.workers("prefill")),
                "decode_workers": len(pool.workers("decode"))}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "pdserve",
                                            "max_model_len": lifecycle.config.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        body.check_model(model_name)
        ids = lifecycle.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        return await _respond(lifecycle, model_name, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        body.check_model(model_name)
        ids = lifecycle.tokenizer.render_chat(body.conversation())
        return await _respond(lifecycle, model_name, body, ids, chat=True)

    return app


async def _respond(lifecycle: Lifecycle, model_name: str, body, prompt_ids: list[int], chat: bool):
    request = GenerationRequest(body.request_id or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                                prompt_ids, body.sampling(), body.slo_class)
    lifecycle.admit(request)  # refuse before any byte is sent, with a proper status
    shape = _Shape(request.request_id, model_name, chat)
    chunks = lifecycle.generate(request, admitted=True)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(chunks, shape, include_usage), media_type="text/event-stream")
    text, last = [], None
    async for chunk in chunks:
        text.append(chunk.text)
        last = chunk
    count("http", OK)
    return shape.whole("".join(text), last)


class _Shape:
    """OpenAI's response objects for completions and chat completions."""

    def __init__(self, request_id: str, model: str, chat: bool):
        self.request_id, self.model, self.chat = request_id, model, chat
        self.created = int(time.time())

    def _base(self, streaming: bool) -> dict:
        kind = ("chat.completion.chunk" if streaming else "chat.completion") if self.chat else "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, last: GenerationChunk) -> dict:
        choice = {"index": 0, "finish_reason": last.finish_reason, "stop_reason": last.stop_reason, "logprobs": None}
        choice |= {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return self._base(False) | {"choices": [choice], "usage": usage(last), "pdserve_timings": last.timings.to_dict()}

    def delta(self, chunk: GenerationChunk) -> dict:
        choice = {"index": 0, "finish_reason": chunk.finish_reason or None, "stop_reason": chunk.stop_reason,
                  "logprobs": None}
        choice |= {"delta": {"content": chunk.text}} if self.chat else {"text": chunk.text}
        body = self._base(True) | {"choices": [choice]}
        if chunk.finished and chunk.timings:
            body["pdserve_timings"] = chunk.timings.to_dict()
        return body


def usage(chunk: GenerationChunk) -> dict:
    timings = chunk.timings
    prompt, output = timings.prompt_tokens, timings.output_tokens
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


async def _sse(chunks: AsyncIterator[GenerationChunk], shape: _Shape,
               include_usage: bool) -> AsyncIterator[str]:
    """The stream's events; an error ends it with an error event. Counts the request once."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(shape.delta(chunk))}\n\n"
            if chunk.finished and include_usage:
                yield f"data: {json.dumps(shape._base(True) | {'choices': [], 'usage': usage(chunk)})}\n\n"
    except ServeError as error:
        count("http", outcome_of(error))
        yield f"data: {json.dumps(error_body(error))}\n\n"
    except (asyncio.CancelledError, GeneratorExit):  # the client went away: nobody to tell
        count("http", CANCELLED)
        raise
    except Exception:  # a bug, after the response started: the client gets an error event, the log the traceback
        logger.exception("stream %s failed", shape.request_id)
        count("http", INTERNAL)
        yield f"data: {json.dumps(error_body(InternalError('internal error')))}\n\n"
    else:
        count("http", OK)
    yield "data: [DONE]\n\n"
