"""The public gRPC API (`pdserve.v1.Generation`) over the request lifecycle. Protobuf stops here.
Every Generate call is counted once in `pdserve_requests_total` (`router.outcomes`) when it ends."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from pdserve.errors import InvalidRequest, ServeError, grpc_code, grpc_trailing_metadata
from pdserve.logprobs import positions_to_proto
from pdserve.sampling import DEFAULT_MAX_TOKENS, Sampling
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from router.lifecycle import Lifecycle
from router.openai_prompt import PromptRules, text_prompt_ids, token_prompt_ids
from router.outcomes import CANCELLED, DUPLICATE_ID, INTERNAL, OK, count, outcome_of
from pdserve.generation import GenerationChunk
from router.types import GenerationRequest


class GenerationService(generation_pb2_grpc.GenerationServicer):
    def __init__(self, lifecycle: Lifecycle, model_name: str):
        self.lifecycle = lifecycle
        self.model_name = model_name
        self._running: dict[str, asyncio.Task] = {}
        self._aborted: set[str] = set()

    async def Generate(self, request: pb.GenerateRequest, context):
        request_id = request.request_id or f"req-{uuid.uuid4().hex}"
        if request_id in self._running:
            count("grpc", DUPLICATE_ID)
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"request_id {request_id} is already running")
        self._running[request_id] = asyncio.current_task()
        ended = INTERNAL  # until known otherwise: what escapes below is a bug (UNKNOWN to the client)
        try:
            internal = GenerationRequest(request_id, self._prompt_ids(request), Sampling.from_proto(request.sampling),
                                         request.slo_class, request.cache_salt)
            async for chunk in self.lifecycle.generate(internal):
                yield chunk_to_proto(chunk)
            ended = OK
        except ServeError as error:
            ended = outcome_of(error)
            await context.abort(grpc_code(error), error.message, trailing_metadata=grpc_trailing_metadata(error))
        except GeneratorExit:  # the stream was closed under us: the client is gone
            ended = CANCELLED
            raise
        except asyncio.CancelledError:
            ended = CANCELLED
            if request_id not in self._aborted:
                raise  # the client went away: nobody to tell
            # An Abort RPC cancelled this stream: the lifecycle has released its blocks on the way
            # out; the client still waits, so end its stream with a status it can act on.
            await context.abort(grpc.StatusCode.CANCELLED, f"request {request_id} was aborted")
        finally:
            count("grpc", ended)
            self._running.pop(request_id, None)
            self._aborted.discard(request_id)

    async def Abort(self, request: pb.AbortRequest, context):
        """Cancels a running Generate; its stream ends with CANCELLED. `found` is False when unknown."""
        task = self._running.get(request.request_id)
        if task is not None:
            self._aborted.add(request.request_id)
            task.cancel()
        return pb.AbortResponse(found=task is not None)

    async def GetModelInfo(self, request, context):
        pool, config = self.lifecycle.pool, self.lifecycle.config
        return pb.ModelInfo(model=self.model_name, max_model_len=config.max_model_len,
                            vocab_size=self.lifecycle.tokenizer.vocab_size,
                            num_prefill_workers=len(pool.workers("prefill")),
                            num_decode_workers=len(pool.workers("decode")))

    def _prompt_ids(self, request: pb.GenerateRequest) -> list[int]:
        """The prompt's ids; with `truncate_prompt_tokens`, truncated as vLLM's server truncates
        them (`router.openai_prompt`: from the left, special tokens added to a text)."""
        which = request.WhichOneof("prompt")
        if which not in ("text", "token_ids"):
            raise InvalidRequest("the request has no prompt: set text or token_ids", field="prompt")
        tokenizer = self.lifecycle.tokenizer
        if not request.HasField("truncate_prompt_tokens"):
            return tokenizer.encode(request.text) if which == "text" else list(request.token_ids.ids)
        sampling = request.sampling
        rules = PromptRules(self.lifecycle.config.max_model_len,
                            sampling.max_tokens if sampling.HasField("max_tokens") else DEFAULT_MAX_TOKENS,
                            truncate_prompt_tokens=request.truncate_prompt_tokens)
        if which == "text":
            return text_prompt_ids(tokenizer.hf, request.text, rules)
        return token_prompt_ids(tokenizer.hf, list(request.token_ids.ids), rules)


class StartingGenerationService:
    """The Generation service of a router that is still starting: its port is bound at once, and
    each call waits (within its own deadline) until `serve` hands over the real service, then goes
    to it. A router restarted under load takes tens of seconds to import vLLM and build its
    lifecycle; a client that reached the old one's port keeps its call instead of spending its
    retry budget on refused connections. Construct it inside the router's event loop."""

    def __init__(self) -> None:
        self._service: asyncio.Future = asyncio.get_running_loop().create_future()

    def serve(self, service: GenerationService) -> None:
        self._service.set_result(service)

    async def Generate(self, request, context):
        service = await self._service
        async for message in service.Generate(request, context):
            yield message

    async def Abort(self, request, context):
        return await (await self._service).Abort(request, context)

    async def GetModelInfo(self, request, context):
        return await (await self._service).GetModelInfo(request, context)


def add_generation_service(service: GenerationService | StartingGenerationService, server) -> None:
    """Registers `service` on `server` as the generated `add_GenerationServicer_to_server` does (the
    methods and types read from the proto's descriptor), except that a request message that does
    not parse is the client's INVALID_ARGUMENT, never gRPC's UNKNOWN (issue 18 item 6)."""
    descriptor = pb.DESCRIPTOR.services_by_name["Generation"]
    handlers = {}
    for method in descriptor.methods:
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            _refusing_undecodable(getattr(service, method.name), method.name, method.server_streaming),
            request_deserializer=_parse_or_keep_error(message_factory.GetMessageClass(method.input_type)),
            response_serializer=message_factory.GetMessageClass(method.output_type).SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(descriptor.full_name, handlers),))


@dataclass(frozen=True)
class _Undecodable:
    """A request message that did not parse, handed on so that its handler refuses it."""
    reason: str


def _parse_or_keep_error(message_type):
    def parse(data: bytes):
        try:
            return message_type.FromString(data)
        except DecodeError as error:
            return _Undecodable(f"the request is not a valid {message_type.DESCRIPTOR.full_name}: {error}")
    return parse


def _refusing_undecodable(behavior, name: str, streaming: bool):
    async def refuse(request: _Undecodable, context) -> None:
        if name == "Generate":  # counted once, as Generate counts every call it sees
            count("grpc", outcome_of(InvalidRequest(request.reason)))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)

    async def unary(request, context):
        if isinstance(request, _Undecodable):
            await refuse(request, context)
        return await behavior(request, context)

    async def stream(request, context):
        if isinstance(request, _Undecodable):
            await refuse(request, context)
        async with contextlib.aclosing(behavior(request, context)) as responses:
            async for response in responses:
                yield response

    return stream if streaming else unary


def chunk_to_proto(chunk: GenerationChunk) -> pb.GenerateResponse:
    message = pb.GenerateResponse(request_id=chunk.request_id, token_ids=chunk.token_ids, text=chunk.text,
                                  finished=chunk.finished, finish_reason=chunk.finish_reason,
                                  logprobs=positions_to_proto(chunk.logprobs),
                                  prompt_logprobs=positions_to_proto(chunk.prompt_logprobs or ()))
    if chunk.timings is not None:
        message.timings.CopyFrom(pb.PhaseTimings(**chunk.timings.to_dict()))
    return message
