"""One request's walk through the cluster (DESIGN.md 2), as an async generator of `GenerationChunk`s.

    validate -> admit (`router.scheduler`: refuse now with a retry time when the predicted TTFT
    misses the SLO) -> wait in the router's queue for a turn and a placement (a prefill worker and
    a decode worker, or Local: the decode worker computes the prompt) -> Prefill (first token
    streams at once) -> Decode (loads the KV, streams the rest) -> final chunk with per-phase timings

Workers are reached through `router.worker_client.WorkerClient` (the pool hands them out); no
protobuf here. Failure and cancel rules:
- a worker that fails a call (`WorkerError`: UNAVAILABLE, INTERNAL, ...) is quarantined and the phase
  is retried on another worker (`router.failures.verdict_for`); a decode that dies mid-stream
  resumes elsewhere from the tokens already sent (`router.resume.resume_plan`: the new worker
  computes prompt + those tokens itself), so the client sees every token exactly once;
- bad input is the client's: INVALID_ARGUMENT is passed through and never retried;
- however the walk ends early (client cancel, Abort, error), the prefill worker is told to release
  the transfer's lease (once: `router.resume.KVLease`) and the decode stream is cancelled, which
  frees blocks on both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import secrets
from dataclasses import dataclass
from typing import AsyncIterator

import grpc

from pdserve import metrics, tracing
from pdserve.errors import InvalidRequest, NoHealthyWorker, Overloaded, from_grpc_code
from pdserve.generation import GenerationChunk
from pdserve.registry import WorkerRecord
from pdserve.sampling import Sampling
from pdserve.timings import Timings
from pdserve.worker_api import DecodeChunk, PrefillRequest, PrefillResult
from router.failures import verdict_for
from router.openai_prompt import check_cache_salt
from router.outcomes import outcome_of
from router.output_text import OutputText, TextStep
from router.policies.placement import Disaggregated
from router.pool import WorkerPool
from router.resume import KVLease, resume_plan
from router.scheduler import Scheduler, SchedulerConfig, Ticket
from router.tokenizer import RouterTokenizer
from router.types import GenerationRequest
from router.worker_client import WorkerError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterConfig:
    max_model_len: int
    max_inflight: int = 256
    max_attempts: int = 3          # per phase
    request_timeout_s: float = 600.0
    enable_prompt_tokens_details: bool = False  # vLLM's flag: usage.prompt_tokens_details.cached_tokens
    scheduler: SchedulerConfig = SchedulerConfig()


@dataclass(frozen=True)
class _Prefilled:
    worker: WorkerRecord
    transfer_id: str
    result: PrefillResult


class Lifecycle:
    def __init__(self, config: RouterConfig, pool: WorkerPool, tokenizer: RouterTokenizer):
        self.config, self.pool, self.tokenizer = config, pool, tokenizer
        self.scheduler = Scheduler(config.scheduler, pool)
        Sampling().check()  # loads vLLM's validation now, not on the first request's path
        self.inflight = 0
        self._releasing: set[asyncio.Task] = set()  # lease releases under way (held so none is dropped)

    def validate(self, request: GenerationRequest) -> None:
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise InvalidRequest("the prompt is empty", field="prompt")
        self.tokenizer.check_ids(request.prompt_token_ids)
        request.sampling.check()
        request.sampling.check_for_model(self.tokenizer.vocab_size)
        if request.cache_salt:
            check_cache_salt(request.cache_salt)
        self.tokenizer.check_bad_words(request.sampling)
        if num_prompt + request.sampling.max_tokens > self.config.max_model_len:
            raise InvalidRequest(
                f"prompt ({num_prompt} tokens) + max_tokens ({request.sampling.max_tokens}) exceeds the model's "
                f"context of {self.config.max_model_len} tokens", field="prompt" if num_prompt >= self.config.max_model_len else "max_tokens")

    def admit(self, request: GenerationRequest) -> None:
        """Raises what would refuse `request` now, before any work is done or any byte is sent:
        bad input, no decode worker (every request ends on one), the router at its limit, or a
        predicted TTFT that misses the SLO by more than the policy allows (`Scheduler.check`)."""
        self.validate(request)
        if not self.pool.workers("decode"):
            raise NoHealthyWorker("no decode worker is alive")
        if self.inflight >= self.config.max_inflight:
            raise Overloaded(f"the router has {self.inflight} requests in flight (limit {self.config.max_inflight})",
                             retry_after_s=1.0)
        self.scheduler.check(request)

    async def generate(self, request: GenerationRequest, admitted: bool = False) -> AsyncIterator[GenerationChunk]:
        """The request's chunks. `admitted`: the caller ran `admit` just before (HTTP does, to answer
        a refusal with a status before any byte is sent); otherwise it runs here."""
        if not admitted:
            self.admit(request)
        self.inflight += 1
        trace = tracing.request_trace(request.request_id, len(request.prompt_token_ids))
        ended_by, timings = None, None
        try:
            async with contextlib.aclosing(self._walk(request, trace)) as walk:  # closing us closes the walk now
                sent_s = None  # when the last chunk with tokens was handed on (ITL)
                async for chunk in walk:
                    if chunk.token_ids:
                        sent_s = metrics.observe_tokens_sent(sent_s)
                    timings = chunk.timings
                    yield chunk
        except BaseException as error:
            ended_by = error
            raise
        finally:
            self.inflight -= 1
            ended = outcome_of(ended_by)
            trace.end(ended.outcome, ended.code, timings)

    async def _walk(self, request: GenerationRequest, trace=tracing.NO_TRACE) -> AsyncIterator[GenerationChunk]:
        started = time.perf_counter()
        timings = Timings(prompt_tokens=len(request.prompt_token_ids))
        ticket = await self.scheduler.dispatch(request)
        router_queued_s = time.perf_counter() - started
        metrics.ROUTER_QUEUE.observe(router_queued_s)
        output = self.tokenizer.output_text(request.prompt_token_ids, request.sampling, request.repetition_detection)
        generated: list[int] = []
        lease: KVLease | None = None
        completed = False
        try:
            prefilled = None
            path = ticket.placement.path
            trace.placed("disaggregated" if isinstance(path, Disaggregated) else "local")
            if isinstance(path, Disaggregated):
                prefilled = await self._prefill(request, timings, path.prefill_id, trace)  # None: decode computes it
                timings.queued_s += router_queued_s
            if prefilled is not None:
                result = prefilled.result
                self.scheduler.prefilled(ticket, timings.prefill_s,
                                         len(request.prompt_token_ids) - result.num_cached_tokens)
                generated.append(result.first_token_id)
                timings.ttft_s = time.perf_counter() - started
                if not result.finished:
                    lease = KVLease(prefilled.worker, prefilled.transfer_id, result.kv_handle)
                step = output.add([result.first_token_id], result.finished, result.finish_reason, result.stop_reason,
                                  (result.first_logprobs,) if result.first_logprobs else (), result.prompt_logprobs)
                if step.finished:
                    timings.output_tokens = 1
                    completed = True
                    if lease is not None:  # a stop string the prefill engine did not see as one
                        self._abandon(lease, request.request_id)
                    yield self._chunk(request, step, timings, started)
                    return
                yield self._chunk(request, step, None, started)
            decode = self._decode(request, lease, generated, timings, output, started, ticket,
                                  path.decode_id, 0.0 if prefilled else router_queued_s, trace)
            async with contextlib.aclosing(decode):
                async for chunk in decode:
                    yield chunk
            completed = True
        finally:
            if lease is not None and not completed:
                self._abandon(lease, request.request_id)
            self.scheduler.finish(ticket, self._held_prefixes(request, timings, generated) if completed else (),
                                  served=timings if completed else None, cache_salt=request.cache_salt)

    @staticmethod
    def _held_prefixes(request: GenerationRequest, timings: Timings, generated: list[int]) -> list:
        """What each worker of a served request now holds in its prefix cache: the prefill worker
        its prompt, the decode worker the prompt and the tokens it generated (a conversation's next
        turn starts with them)."""
        held = [(timings.decode_worker, list(request.prompt_token_ids) + generated[:-1])]
        if timings.disaggregated and timings.prefill_worker:
            held.append((timings.prefill_worker, list(request.prompt_token_ids)))
        return [(worker, tokens) for worker, tokens in held if worker]

    def _chunk(self, request, step: TextStep, timings, started) -> GenerationChunk:
        if timings is not None:
            timings.e2e_s = time.perf_counter() - started
            metrics.observe_finished(timings)
        return GenerationChunk(request.request_id, list(step.token_ids), step.text, step.finished, step.finish_reason,
                               timings, step.stop_reason, list(step.logprobs),
                               None if step.prompt_logprobs is None else list(step.prompt_logprobs))

    async def _prefill(self, request: GenerationRequest, timings: Timings, preferred: str,
                       trace=tracing.NO_TRACE) -> _Prefilled | None:
        """The prompt on the `preferred` prefill worker (the placement's), then on others if it fails."""
        transfer_id = secrets.token_hex(16)   # unguessable (128 bits); the KV plane binds it to its first consumer
        message = PrefillRequest(request.request_id, tuple(request.prompt_token_ids), request.sampling, transfer_id,
                                 request.cache_salt)
        tried: set[str] = set()
        for attempt in range(self.config.max_attempts):
            worker = self._choose("prefill", preferred if attempt == 0 else None, tried)
            if worker is None:
                break
            tried.add(worker.worker_id)
            sent = time.perf_counter()
            try:
                with self.pool.track(worker), trace.phase("prefill", worker.worker_id):
                    result = await self.pool.client(worker).prefill(message, timeout_s=self.config.request_timeout_s)
            except asyncio.CancelledError:
                # The engine may have finished (and leased the KV) just as the client left: the
                # reply that would name it is lost, so release by the transfer id we chose.
                self._release_soon(worker, transfer_id, request.request_id)
                raise
            except WorkerError as error:
                self._on_worker_error(worker, error)
                continue
            timings.queued_s = result.queued_s
            timings.prefill_s = max(0.0, time.perf_counter() - sent - result.queued_s)
            timings.prefill_worker = worker.worker_id
            timings.cached_prompt_tokens = result.num_cached_tokens
            timings.disaggregated = True
            return _Prefilled(worker, transfer_id, result)
        logger.warning("no prefill worker could take %s (tried %d): decode computes the prompt",
                       request.request_id, len(tried))
        return None

    def _choose(self, role: str, preferred: str | None, tried: set[str]) -> WorkerRecord | None:
        """The placement's worker when it is still alive and untried, else the least loaded."""
        record = self.pool.get(preferred) if preferred and preferred not in tried else None
        return record if record is not None and record.role == role else self.pool.pick(role, frozenset(tried))

    async def _decode(self, request, lease: KVLease | None, generated: list[int], timings, output: OutputText,
                      started, ticket: Ticket, preferred: str, router_queued_s: float,
                      trace=tracing.NO_TRACE) -> AsyncIterator[GenerationChunk]:
        """Streams decode output; `generated` (the tokens already sent) grows as tokens arrive.
        A stop string found in the whole output (`router.output_text`) ends the request here: the
        stream is closed, which aborts the decode on its worker.

        Each attempt is `resume_plan(request, generated, attempt, handle)`: it resumes exactly where
        the client is. A failed attempt abandons the lease (the producer is told to release; the
        next worker computes the prompt and the tokens so far itself)."""
        tried: set[str] = set()
        for attempt in range(self.config.max_attempts):
            plan = resume_plan(request, generated, attempt, lease.handle_for_next_attempt() if lease else None)
            if plan is None:  # the stream broke after its last token: the client has them all
                if lease is not None:
                    self._abandon(lease, request.request_id)  # nobody will pull it now
                timings.output_tokens = len(generated)
                yield self._chunk(request, output.add((), True, "length"), timings, started)
                return
            worker = self._choose("decode", preferred if attempt == 0 else None, tried)
            if worker is None:
                break
            tried.add(worker.worker_id)
            sent = time.perf_counter()
            try:
                with self.pool.track(worker), trace.phase("decode", worker.worker_id):
                    stream = self.pool.client(worker).decode(plan, timeout_s=self.config.request_timeout_s)
                    async with contextlib.aclosing(stream):
                        async for reply in stream:
                            step = output.add(reply.token_ids, reply.finished, reply.finish_reason, reply.stop_reason,
                                              reply.logprobs, reply.prompt_logprobs)
                            generated.extend(step.token_ids)
                            if not timings.ttft_s and reply.token_ids:
                                timings.ttft_s = time.perf_counter() - started
                                self.scheduler.prefilled(ticket, None)  # a Local prompt is computed
                            if reply.finished and reply.kv_load_error:
                                metrics.KV_LOAD_FAILURES.inc()
                            if step.finished:
                                self._finish_timings(timings, reply, worker, sent, len(plan.prompt_token_ids),
                                                     len(generated))
                                timings.queued_s += router_queued_s
                            yield self._chunk(request, step, timings if step.finished else None, started)
                            if step.finished:
                                return
                # A stream that ends without its final chunk (a worker that closed it early) is that
                # worker's failure, resumed from the tokens sent like a broken one.
                raise WorkerError(grpc.StatusCode.UNAVAILABLE,
                                  f"decode worker {worker.worker_id} ended the stream without finishing")
            except WorkerError as error:
                self._on_worker_error(worker, error)
                if lease is not None:
                    self._abandon(lease, request.request_id)  # the producer's KV is no longer wanted
                continue
        raise NoHealthyWorker(f"no decode worker could take the request (tried {len(tried)})")

    @staticmethod
    def _finish_timings(timings: Timings, reply: DecodeChunk, worker: WorkerRecord, sent: float, num_decode_prompt: int,
                        num_generated: int) -> None:
        timings.decode_s = time.perf_counter() - sent
        if not timings.disaggregated:  # decode-only: the decode engine's queue is the request's
            timings.queued_s = reply.queued_s
            timings.decode_s = max(0.0, timings.decode_s - reply.queued_s)
            timings.cached_prompt_tokens = reply.num_cached_tokens
        timings.decode_worker = worker.worker_id
        timings.kv_transfer_bytes = reply.kv_transfer_bytes
        timings.kv_transfer_s = reply.kv_transfer_s
        timings.kv_transfer_blocks = reply.kv_transfer_blocks
        timings.output_tokens = num_generated
        # vLLM (0.32) counts the tokens a connector loaded in num_cached_tokens, with its own prefix hits
        timings.decode_computed_prompt_tokens = num_decode_prompt - reply.num_cached_tokens

    def _on_worker_error(self, worker: WorkerRecord, error: WorkerError) -> None:
        """Raises the client's errors; quarantines a worker at fault (`router.failures`). Returning
        means: retry the phase on another worker."""
        verdict = verdict_for(error.code)
        if verdict.end_request:
            raise from_grpc_code(error.code, error.details)
        if verdict.quarantine:
            metrics.WORKER_FAILURES.labels(worker.role).inc()
            self.pool.quarantine(worker)

    async def wait_for_releases(self) -> None:
        """Returns when every lease release started so far has ended (sent, or given up on)."""
        while self._releasing:
            await asyncio.gather(*self._releasing)

    def _abandon(self, lease: KVLease, request_id: str) -> None:
        if lease.abandon():
            self._release_soon(lease.worker, lease.transfer_id, request_id)

    def _release_soon(self, worker: WorkerRecord, transfer_id: str, request_id: str) -> None:
        task = asyncio.create_task(self._release(worker, transfer_id, request_id))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release(self, worker: WorkerRecord, transfer_id: str, request_id: str) -> None:
        """Frees the prefill worker's KV for an abandoned transfer (no-op if already pulled or never held)."""
        try:
            await self.pool.client(worker).release(transfer_id, request_id)
        except WorkerError as error:  # worker gone (its blocks with it), or the lease expires
            logger.info("could not release transfer %s: %s", transfer_id, error.code.name)
