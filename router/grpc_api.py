"""The public gRPC API (`pdserve.v1.Generation`) over the request lifecycle. Protobuf stops here.
Every Generate call is counted once in `pdserve_requests_total` (`router.outcomes`) when it ends."""

from __future__ import annotations

import asyncio
import uuid

import grpc

from pdserve.errors import InvalidRequest, ServeError, grpc_code, grpc_trailing_metadata
from pdserve.sampling import Sampling
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from router.lifecycle import Lifecycle
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
                                         request.slo_class)
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
        which = request.WhichOneof("prompt")
        if which == "text":
            return self.lifecycle.tokenizer.encode(request.text)
        if which == "token_ids":
            return list(request.token_ids.ids)
        raise InvalidRequest("the request has no prompt: set text or token_ids", field="prompt")


def chunk_to_proto(chunk: GenerationChunk) -> pb.GenerateResponse:
    message = pb.GenerateResponse(request_id=chunk.request_id, token_ids=chunk.token_ids, text=chunk.text,
                                  finished=chunk.finished, finish_reason=chunk.finish_reason)
    if chunk.timings is not None:
        message.timings.CopyFrom(pb.PhaseTimings(**chunk.timings.to_dict()))
    return message
