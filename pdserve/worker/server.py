"""The process around one vLLM engine: gRPC `Worker` service, health, registry lease, drain.

Role behaviour lives in `prefill_worker.handler` and `decode_worker.handler` behind the contract
of `pdserve.worker.handler`; this module is what both roles share. Life of the process:

    start engine -> serve gRPC -> heartbeat into Redis every heartbeat_s
    SIGTERM/SIGINT -> health NOT_SERVING, leave the registry (no new work is routed here),
                      wait for in-flight requests and, on prefill, for leased KV to be pulled
                      (up to drain_timeout_s; `pdserve.worker.drain`), stop the engine, exit 0
    engine died    -> health NOT_SERVING, leave the registry, exit non-zero at once so the
                      supervisor restarts the worker (`pdserve.worker.watchdog`)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import grpc

from pdserve import tracing
from pdserve.errors import InvalidRequest, ServeError, grpc_code
from pdserve.sampling import engine_error_field, is_engine_input_error
from pdserve.worker.config import WorkerConfig
from pdserve.worker.handler import Decodes, Prefills, RoleHandler
from pdserve.worker.load import EngineLoad
from pdserve.worker.watchdog import EngineWatchdog
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from pdserve.worker_proto import (decode_chunk_to_proto, decode_request_from_proto, prefill_request_from_proto,
                                  prefill_result_to_proto)

@dataclass
class WorkerRuntime:
    """What a role handler may use: the engine, the config, and the in-flight bookkeeping."""

    config: WorkerConfig
    engine: object
    load: EngineLoad
    kv_address: str = ""
    inflight: dict[str, str] = field(default_factory=dict)  # request id -> transfer id ("" if none)

    @property
    def model_name(self) -> str:
        return os.path.basename(os.path.normpath(self.config.engine.model))


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, runtime: WorkerRuntime, handler: RoleHandler, watchdog: EngineWatchdog | None = None):
        self.runtime = runtime
        self.handler = handler
        self.watchdog = watchdog

    async def _fail(self, context, error: Exception) -> None:
        """Ends the RPC for `error`: UNAVAILABLE when the engine is dead (the watchdog is told, and
        the router retries elsewhere), else the status `_abort_for` gives it."""
        if self.watchdog is not None and self.watchdog.report(error):
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"worker {self.runtime.config.worker_id}: its vLLM engine is dead; the worker is leaving")
        await _abort_for(context, error)

    async def Prefill(self, request, context):
        if not isinstance(self.handler, Prefills):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this is a {self.runtime.config.role} worker: send Prefill to a prefill worker")
        self.runtime.inflight[request.request_id] = request.transfer_id
        try:
            with tracing.worker_span("prefill", context, request.request_id):
                return prefill_result_to_proto(await self.handler.prefill(prefill_request_from_proto(request)))
        except Exception as error:
            await self._fail(context, error)
        finally:
            self.runtime.inflight.pop(request.request_id, None)

    async def Decode(self, request, context):
        if not isinstance(self.handler, Decodes):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this is a {self.runtime.config.role} worker: send Decode to a decode worker")
        self.runtime.inflight[request.request_id] = ""
        try:
            with tracing.worker_span("decode", context, request.request_id) as span:
                async for chunk in self.handler.decode(decode_request_from_proto(request)):
                    if chunk.finished:
                        span.decoded(chunk)
                    yield decode_chunk_to_proto(chunk)
        except Exception as error:
            await self._fail(context, error)
        finally:
            self.runtime.inflight.pop(request.request_id, None)

    async def Abort(self, request, context):
        found = request.request_id in self.runtime.inflight
        await self.runtime.engine.abort(request.request_id)
        if request.transfer_id:
            found = await self.handler.release(request.transfer_id) or found
        return worker_pb2.WorkerAbortResponse(found=found)

    async def GetLoad(self, request, context):
        load = self.runtime.load
        return worker_pb2.Load(
            role=self.runtime.config.role, worker_id=self.runtime.config.worker_id,
            num_waiting=load.num_waiting, num_running=load.num_running,
            kv_blocks_used=load.kv_blocks_used, kv_blocks_total=load.kv_blocks_total,
            pending_transfers=load.pending_transfers, recent_ttft_s=load.recent_ttft_s,
            recent_tpot_s=load.recent_tpot_s, num_inflight=len(self.runtime.inflight),
            prompt_tokens_computed=load.prompt_tokens_computed, prompt_tokens_external=load.prompt_tokens_external,
            prompt_tokens_local_hit=load.prompt_tokens_local_hit, generation_tokens=load.generation_tokens,
        )


async def _abort_for(context, error: Exception) -> None:
    """Ends the RPC with the status `error` deserves; re-raises what is no request's error (a dead
    engine, a bug), which gRPC reports as UNKNOWN and the router treats as this worker's fault."""
    serve_error = as_serve_error(error)
    if serve_error is None:
        raise error
    await context.abort(grpc_code(serve_error), serve_error.message)


def as_serve_error(error: Exception) -> ServeError | None:
    """The typed error for what a handler raised, or None if it is not the request's doing.

    vLLM rejects bad input (too long, bad ids, a sampling value out of range) with ValueError or
    its `VLLMClientError`: that is the client's error, INVALID_ARGUMENT, never the worker's."""
    if isinstance(error, ServeError):
        return error
    if is_engine_input_error(error):
        return InvalidRequest(str(error), field=engine_error_field(error))
    return None


def engine_queued_s(output) -> float:
    """How long the request waited in vLLM's queue before its first step (0 without vLLM's stats).

    Both timestamps are the engine core's monotonic clock: `queued_ts` when the scheduler took the
    request, `scheduled_ts` when a step first included it."""
    stats = getattr(output, "metrics", None)
    if stats is None or not stats.scheduled_ts or not stats.queued_ts:
        return 0.0
    return max(0.0, stats.scheduled_ts - stats.queued_ts)
