"""OpenAI-compatible HTTP API on the same request path as gRPC (`Lifecycle.generate`).

    POST /v1/completions, POST /v1/chat/completions (SSE when "stream": true)
    POST /tokenize, POST /detokenize (vLLM's)
    GET /v1/models, GET /health, GET /metrics, GET /openapi.json (every status each route answers:
    `router.openapi_statuses`)
Request bodies and their meanings are vLLM's (`router.openai_schema`); a `model` other than the
served name is 404, as vLLM answers it. A request's choices (a batch of prompts, `n` samples of
each) are walks of their own, merged as they stream; the response objects are vLLM's
(`router.openai_response`). The text, stop strings included, and the logprobs are made by the
lifecycle (`router.output_text`), so HTTP and gRPC see the same. Errors use OpenAI's body, {"error":
{"message", "type", "param", "code"}}, with the status from `pdserve.errors`; an error after streaming began is sent as a final SSE event. Every completion
request is counted once in `pdserve_requests_total` (`router.outcomes`): by the error handlers when
it fails before its response starts, else when its response (or stream) ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from http import HTTPStatus
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdserve.errors import (
    InternalError, InvalidRequest, MalformedBody, NotFound, ServeError, http_status, retry_after_header,
)
from pdserve.generation import GenerationChunk
from router.lifecycle import Lifecycle
from router.openai_errors import error_body
from router.openai_beam import STREAM_REFUSAL, beam_streams
from router.openai_response import (
    ChoiceState, Echo, LogprobsAsked, ResponseShape, StreamInterval, merged, model_list, usage,
)
from router.openai_chat import ChatCompletionRequest
from router.openai_prompt import text_prompt_ids, token_prompt_ids
from router.openai_schema import CompletionRequest, DetokenizeRequest, TokenizeRequest, context_room
from router.openai_tools import ChatParsers, ChatParsing, RequestParsing
from router.openapi_statuses import (
    GENERATION_ERRORS, KEYED_ERRORS, PLAIN_ERRORS, SSE_200, TOKENIZE_ERRORS, openapi_schema, responses_for,
)
from router.outcomes import CANCELLED, INTERNAL, OK, count, outcome_of
from router.types import GenerationRequest

logger = logging.getLogger(__name__)


def error_response(error: ServeError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=http_status(error), headers=retry_after_header(error))


def _validation_error(exc: RequestValidationError) -> MalformedBody:
    """The body's first schema error; `param` is vLLM's for it (the location with its "body."
    and without pydantic's union markers), the message names the field without "body."."""
    from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param

    first = exc.errors()[0]
    location = tuple(first.get("loc", ()))
    param = clean_loc_for_param(location) if location else None
    field = ".".join(str(part) for part in location if part != "body") or None
    reason = "unknown field" if first.get("type") == "extra_forbidden" else first.get("msg", "invalid value")
    return MalformedBody(f"{field}: {reason}" if field else reason, field=param)


def create_app(lifecycle: Lifecycle, model_name: str, model_root: str | None = None,
               parsing: ChatParsing = ChatParsing()) -> FastAPI:
    """The app serving `model_name`; `model_root` is the model's path as the router was given it
    (`/v1/models` says it as vLLM's `root`); `parsing`, the parsers of a chat's answer
    (`router.openai_tools`: none by default, as in vLLM)."""
    parsers = ChatParsers(parsing, lifecycle.tokenizer.hf if parsing.uses_parser else None)
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
    app.openapi = lambda: openapi_schema(app)  # every status a route answers, and no 422 (router.openapi_statuses)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        error = _validation_error(exc)
        count("http", outcome_of(error))
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def on_starlette_refusal(request: Request, exc: StarletteHTTPException):
        """Starlette's own refusals in OpenAI's body: a body that does not parse is the request's
        400 (counted as one), no such route 404, any other (405) with its status and headers."""
        if exc.status_code == 400:
            error = MalformedBody(f"the request body could not be parsed: {exc.detail}")
            count("http", outcome_of(error))
            return error_response(error)
        if exc.status_code == 404:
            return error_response(NotFound(str(exc.detail)))
        return JSONResponse({"error": {"message": str(exc.detail), "type": HTTPStatus(exc.status_code).phrase,
                                       "param": None, "code": exc.status_code}},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ServeError)
    async def on_serve_error(request: Request, exc: ServeError):
        count("http", outcome_of(exc))
        return error_response(exc)

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception):
        """A bug, not the client's doing: 500 with OpenAI's body (Starlette logs the traceback)."""
        count("http", INTERNAL)
        return error_response(InternalError("internal error"))

    @app.get("/health", responses=responses_for(PLAIN_ERRORS))
    async def health():
        """Liveness: 200 while the router runs; the body says whether it can serve right now."""
        pool = lifecycle.pool
        return {"status": "ok", "prefill_workers": len(pool.workers("prefill")),
                "decode_workers": len(pool.workers("decode"))}

    @app.get("/metrics", response_class=PlainTextResponse, responses=responses_for(PLAIN_ERRORS))
    async def metrics():
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", responses=responses_for(KEYED_ERRORS))
    async def models():
        return model_list(model_name, model_root, lifecycle.config.max_model_len)

    @app.post("/v1/completions", responses=SSE_200 | responses_for(GENERATION_ERRORS))
    async def completions(body: CompletionRequest):
        """Each prompt tokenized (or its ids taken) as vLLM's renderer does (`router.openai_prompt`);
        an echo's text is the prompt's as vLLM echoes it: the text sent, a token-id prompt's ids
        decoded before truncation, nothing with `return_token_ids`."""
        body.check_model(model_name)
        if body.stream and body.use_beam_search:
            raise InvalidRequest(STREAM_REFUSAL)   # vLLM's (a chat's beam search streams)
        tokenizer, rules = lifecycle.tokenizer, body.prompt_rules(lifecycle.config.max_model_len)
        prompts, echoes = [], []   # echoes: one per prompt with `echo`, else none
        for prompt in body.prompts():
            ids = (text_prompt_ids(tokenizer.hf, prompt, rules) if isinstance(prompt, str)
                   else token_prompt_ids(tokenizer.hf, prompt, rules))
            prompts.append(ids)
            if body.echo:
                text = "" if body.return_token_ids else prompt if isinstance(prompt, str) else tokenizer.decode(prompt)
                echoes.append(Echo(text, ids, only=body.echo_only))
        return await _respond(lifecycle, model_name, body, prompts, chat=False, echoes=echoes)

    @app.post("/v1/chat/completions", responses=SSE_200 | responses_for(GENERATION_ERRORS))
    async def chat_completions(body: ChatCompletionRequest):
        """The conversation rendered by the model's template with vLLM's arguments, then tokenized
        as vLLM's renderer does (`router.openai_prompt`); with a parser, the answer is parsed as
        vLLM parses it (`router.openai_tools`)."""
        body.check_model(model_name)
        kwargs = body.template_kwargs()
        parsing = parsers.for_request(body, kwargs)
        if parsing is not None:
            body = body.model_copy(update=parsing.sampling_overrides())
        rules = body.prompt_rules(lifecycle.config.max_model_len)
        rules.vllm()   # vLLM checks the lengths asked before it renders
        rendered = lifecycle.tokenizer.apply_template(body.conversation(), kwargs)
        hf = lifecycle.tokenizer.hf
        ids = token_prompt_ids(hf, rendered, rules) if isinstance(rendered, list) else text_prompt_ids(hf, rendered,
                                                                                                         rules)
        echo = body.echo_text()
        prompt_text = rendered if body.return_prompt_text and isinstance(rendered, str) else None
        return await _respond(lifecycle, model_name, body, [ids], chat=True,
                              echoes=[None if echo is None else Echo(echo, [])], prompt_text=prompt_text,
                              parsing=parsing)

    @app.post("/tokenize", responses=responses_for(TOKENIZE_ERRORS))
    async def tokenize(body: TokenizeRequest):
        """vLLM's /tokenize: the ids a prompt (or a chat, rendered) is served as."""
        body.check_model(model_name)
        tokenizer = lifecycle.tokenizer
        if body.messages is not None:
            ids = body.chat_ids(tokenizer)
        else:
            ids = tokenizer.tokenize(body.prompt, body.add_special_tokens is not False)
        return {"count": len(ids), "max_model_len": lifecycle.config.max_model_len, "tokens": ids,
                "token_strs": tokenizer.token_strings(ids) if body.return_token_strs else None}

    @app.post("/detokenize", responses=responses_for(TOKENIZE_ERRORS))
    async def detokenize(body: DetokenizeRequest):
        """vLLM's /detokenize: the text of token ids (special tokens included)."""
        body.check_model(model_name)
        lifecycle.tokenizer.check_ids(body.tokens)
        return {"prompt": lifecycle.tokenizer.decode(body.tokens)}

    return app


async def _respond(lifecycle: Lifecycle, model_name: str, body, prompts: list[list[int]], chat: bool,
                   echoes: list[Echo | None] | None = None, prompt_text: str | None = None,
                   parsing: RequestParsing | None = None):
    """Each prompt's `n` choices (choice index prompt * n + sample, vLLM's numbering): sampled walks
    of their own, or a beam search's best beams (`router.openai_beam`); every one admitted before
    any byte is sent, merged as they stream. What vLLM's engine refuses (`engine_refusal`) is
    refused as vLLM's server refuses it: a stream in its one event, a whole answer with its status.
    `parsing`: a chat's tool (and reasoning) parsers."""
    request_id = body.request_id or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    beam = bool(body.use_beam_search)
    if not beam:
        body.sampling()  # refuses what vLLM refuses (n < 1 too) before any walk is made
    refusal = body.engine_refusal()
    if refusal is not None:
        if not body.stream:
            raise refusal
        return StreamingResponse(_refused_stream(refusal), media_type="text/event-stream")
    streams = (beam_streams if beam else _sampled_streams)(lifecycle, body, request_id, prompts)
    states = [ChoiceState(prompt_index * body.n + sample, echoes[prompt_index] if echoes else None,
                          prompt_token_ids=prompt_ids if body.return_token_ids else None,
                          parser=parsing.choice(prompt_ids) if parsing is not None else None)
              for prompt_index, prompt_ids in enumerate(prompts) for sample in range(body.n)]
    num_choices = len(states)
    if num_choices > 1 and num_choices > lifecycle.config.max_inflight:
        raise InvalidRequest(f"{num_choices} choices (prompts x n) exceed the router's limit of "
                             f"{lifecycle.config.max_inflight} requests in flight", field="n")
    asked = LogprobsAsked(body.num_top_logprobs, bool(body.return_tokens_as_token_ids),
                          prompt=body.num_prompt_logprobs is not None,   # echo's too: vLLM sends what it asked
                          listed=bool(body.logprob_token_ids))
    shape = ResponseShape(request_id, model_name, chat, lifecycle.tokenizer.decode_one, asked,
                          role=body.role if chat else "assistant", token_ids=bool(body.return_token_ids),
                          prompt_text=prompt_text)
    num_prompt_tokens = sum(len(ids) for ids in prompts)
    details = lifecycle.config.enable_prompt_tokens_details and not beam   # vLLM's beam answer has no cached count
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(streams, states, shape, num_prompt_tokens, include_usage, details,
                                      body.stream_interval or 1), media_type="text/event-stream")
    chunks: list[list[GenerationChunk]] = [[] for _ in states]
    async for index, chunk in _merge(streams):
        chunks[index].append(chunk)
    count("http", OK)
    # a choice without chunks: a beam search that ended with fewer beams than `n` (`max_tokens` 0)
    answers = [(state, merged(choice)) for state, choice in zip(states, chunks) if choice]
    completion_tokens = sum(len(chunk.token_ids) for _, chunk in answers)
    whole = shape.whole(answers, usage(num_prompt_tokens, completion_tokens,
                                       _cached_tokens(answers[-1][1]) if details else None))
    return _with_reasoning_tokens(whole, states)


def _with_reasoning_tokens(body: dict, states: list[ChoiceState]) -> dict:
    """vLLM's `completion_tokens_details` in `body`'s usage when a reasoning parser counted the
    choices' reasoning tokens (`router.openai_tools.ChoiceParser`)."""
    parsers = [state.parser for state in states if state.parser is not None and state.parser.counts_reasoning]
    if parsers:
        body["usage"]["completion_tokens_details"] = {"reasoning_tokens": sum(p.reasoning_tokens() for p in parsers)}
    return body


def _sampled_streams(lifecycle: Lifecycle, body, request_id: str,
                     prompts: list[list[int]]) -> list[AsyncIterator[GenerationChunk]]:
    """Each prompt's `n` samples as walks of their own, every one admitted now."""
    num_choices = len(prompts) * body.n
    requests = []
    for prompt_index, prompt_ids in enumerate(prompts):
        room = context_room(len(prompt_ids), lifecycle.config.max_model_len)   # max_tokens is capped to it
        for sample in range(body.n):
            index = prompt_index * body.n + sample
            walk_id = request_id if num_choices == 1 else f"{request_id}-{index}"
            requests.append(GenerationRequest(walk_id, prompt_ids, body.sampling(sample, room), body.slo_class,
                                              body.cache_salt or "", body.repetition_detection))
    for request in requests:
        lifecycle.admit(request)  # refuse before any byte is sent, with a proper status
    return [lifecycle.generate(request, admitted=True) for request in requests]


def _cached_tokens(chunk: GenerationChunk) -> int:
    """vLLM's `num_cached_tokens` of a choice: the prompt tokens its prompt's engine had cached
    (vLLM reports the last prompt's when not streaming, the first to answer when streaming)."""
    return chunk.timings.cached_prompt_tokens if chunk.timings else 0


async def _merge(streams: list[AsyncIterator[GenerationChunk]]) -> AsyncIterator[tuple[int, GenerationChunk]]:
    """(choice index, chunk) from every stream as they come. The first error ends all of them (the
    others are cancelled, which ends their walks and frees their KV), as one failed vLLM request
    fails its siblings; closing this closes them all."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as stream:
            async for chunk in stream:
                yield 0, chunk
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[GenerationChunk]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    queue.put_nowait((index, chunk, None))
        except Exception as error:  # handed to the consumer, which raises it
            queue.put_nowait((index, None, error))
        else:
            queue.put_nowait((index, None, None))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, chunk, error = await queue.get()
            if error is not None:
                raise error
            if chunk is None:
                running -= 1
                continue
            yield index, chunk
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _refused_stream(error: ServeError) -> AsyncIterator[str]:
    """A stream refused before its first token, as vLLM's server streams its engine's refusal: the
    error event alone. Counts the request once."""
    count("http", outcome_of(error))
    yield f"data: {json.dumps(error_body(error))}\n\n"
    yield "data: [DONE]\n\n"


async def _sse(streams: list[AsyncIterator[GenerationChunk]], states: list[ChoiceState], shape: ResponseShape,
               num_prompt_tokens: int, include_usage: bool, details: bool,
               stream_interval: int = 1) -> AsyncIterator[str]:
    """The stream's events, each choice's chunks batched by vLLM's `stream_interval`
    (`StreamInterval`); an error ends it with an error event. Counts the request once."""
    num_completion_tokens, cached_tokens = 0, None
    intervals = [StreamInterval(stream_interval) for _ in states]
    try:
        if shape.chat:
            for event in shape.opening_events(states):
                yield f"data: {json.dumps(event)}\n\n"
        async with contextlib.aclosing(_merge(streams)) as chunks:
            async for index, chunk in chunks:
                num_completion_tokens += len(chunk.token_ids)
                if chunk.finished and cached_tokens is None:
                    cached_tokens = _cached_tokens(chunk)
                chunk = intervals[index].add(chunk)
                event = None if chunk is None else shape.event(states[index], chunk)
                if event is not None:   # None: held for the interval, or by a parser (vLLM sends nothing)
                    yield f"data: {json.dumps(event)}\n\n"
        if include_usage:
            body = _with_reasoning_tokens(shape.base(True) | {"choices": [], "usage": usage(
                num_prompt_tokens, num_completion_tokens, cached_tokens if details else None)}, states)
            yield f"data: {json.dumps(body)}\n\n"
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
