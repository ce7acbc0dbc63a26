"""The runner: sends a workload to a target and records what happened to every request.

Two modes:
- "arrivals": request i is sent at `specs[i].arrival_s` after the start (open loop); an optional
  `max_concurrency` caps requests in flight (later arrivals wait for a slot, and the wait, from
  the arrival to taking a slot, is recorded as `client_queue_s`, as `vllm bench serve
  --max-concurrency` records `client_queue_time`; 0.0 for a request that found a slot free);
- "concurrency": arrival times are ignored and exactly `max_concurrency` requests are kept in
  flight (closed loop). A request comes into being when a slot frees, so its `scheduled_s` is
  that moment and its `client_queue_s` is 0.0 by definition. (vLLM's `--request-rate inf
  --max-concurrency N` is instead "arrivals" mode with every arrival at 0, where the queue time
  grows with the request's place in line.)
`duration_s` stops sending new requests after that long (in-flight ones finish); in concurrency
mode with a duration the workload's lengths are reused cyclically with fresh prompts.

Invariant: every request that is sent yields exactly one `RequestRecord`, whose status is
"ok", "refused" (the server said no at admission: HTTP 429, gRPC RESOURCE_EXHAUSTED), "error"
(with the error text) or "timeout" (`request_timeout_s` from sending). Warm-up
requests run first, are recorded separately and are never counted in the metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Literal

from loadgen.prompts import Prompt, PromptSynthesizer
from loadgen.targets.base import PhaseTimings, Refused, Target
from loadgen.workload import RequestSpec

Status = Literal["ok", "refused", "error", "timeout"]


@dataclass(frozen=True)
class RunConfig:
    mode: Literal["arrivals", "concurrency"] = "arrivals"
    max_concurrency: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.mode not in ("arrivals", "concurrency"):
            raise ValueError(f"mode must be 'arrivals' or 'concurrency', got {self.mode!r}")
        if self.mode == "concurrency" and self.max_concurrency is None:
            raise ValueError("concurrency mode needs max_concurrency (how many requests to keep in flight)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0 seconds, got {self.duration_s}")
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0 seconds, got {self.request_timeout_s}")


@dataclass(frozen=True)
class RequestRecord:
    """One sent request. Times are seconds; `sent_s` is from the run start, the rest from sending."""

    index: int
    scheduled_s: float  # its arrival: the scheduled time, or when its slot freed in concurrency mode
    sent_s: float
    client_queue_s: float  # arrival to taking a concurrency slot (0.0: a slot was free; see the module doc)
    prompt_tokens: int
    requested_output_tokens: int
    status: Status
    error: str = ""
    output_tokens: int = 0  # the server's count (usage) when reported, else counted from the stream
    chunk_times_s: tuple[float, ...] = ()  # arrival of each content chunk
    phases: PhaseTimings | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.ok else None

    @property
    def e2el_s(self) -> float | None:
        """Send to the last content chunk, as `vllm bench serve` measures latency."""
        return self.chunk_times_s[-1] if self.ok else None

    @property
    def itls_s(self) -> tuple[float, ...]:
        times = self.chunk_times_s
        return tuple(b - a for a, b in zip(times, times[1:])) if self.ok else ()


@dataclass(frozen=True)
class RunResult:
    backend: str
    config: RunConfig
    records: tuple[RequestRecord, ...]
    duration_s: float  # first send to the end of the last request
    warmup: tuple[RequestRecord, ...] = field(default=())
    start_s: float = 0.0  # perf_counter time of the run's start (records' `sent_s` count from it)


OnDone = Callable[[RequestRecord], None]


async def run(target: Target, specs: Sequence[RequestSpec], prompts: PromptSynthesizer,
              config: RunConfig, on_done: OnDone | None = None) -> RunResult:
    """Open nothing, close nothing: the caller owns the target's `open`/`close`."""
    if not specs:
        raise ValueError("the workload is empty: ask for at least one request")
    warmup = await _warm_up(target, specs, prompts, config)
    gate = _SlotGate(config.max_concurrency) if config.max_concurrency else None
    closed_loop = config.mode == "concurrency"
    start = time.perf_counter()
    tasks: list[asyncio.Task[RequestRecord]] = []
    for index, spec in enumerate(_schedule(specs, config)):
        scheduled_s, queue_s = (0.0 if closed_loop else spec.arrival_s), 0.0
        if _past_deadline(config, scheduled_s) or _past_deadline(config, time.perf_counter() - start):
            break
        await asyncio.sleep(max(0.0, start + scheduled_s - time.perf_counter()))
        if gate is not None:
            queue_s = await gate.take(start + scheduled_s)
        sent_at = time.perf_counter()
        if gate is not None:
            if _past_deadline(config, sent_at - start):
                gate.release()
                break
            if closed_loop:  # the request arrives when its slot frees: no queue by definition
                scheduled_s, queue_s = sent_at - start, 0.0
        sending = _Sending(index, scheduled_s, queue_s, start, sent_at, gate.release if gate else None)
        tasks.append(asyncio.create_task(
            _send(target, prompts.prompt(spec, index), spec, sending, config.request_timeout_s, on_done)))
    records = await asyncio.gather(*tasks)
    return RunResult(target.name, config, tuple(records), time.perf_counter() - start, warmup, start)


class _SlotGate:
    """At most `limit` requests in flight, and how long each waited for a slot.

    Requests take slots in arrival order, one at a time, so a request waited for a slot when it
    found every slot taken, or when the send loop was held up waiting for a slot (for an earlier
    request) at any moment after this request's arrival. Its wait is then the time from its
    arrival to taking a slot, else 0.0 exactly (the event loop sending it a little late is not
    queueing for a slot).
    """

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._last_block_end = float("-inf")  # perf_counter time the last blocked take() got its slot

    async def take(self, arrival: float) -> float:
        """Wait for a slot; the seconds since `arrival` (a perf_counter time) spent waiting for one."""
        blocked = self._slots.locked()
        await self._slots.acquire()
        now = time.perf_counter()
        if blocked:
            self._last_block_end = now
        return max(0.0, now - arrival) if self._last_block_end > arrival else 0.0

    def release(self) -> None:
        self._slots.release()


@dataclass(frozen=True)
class _Sending:
    """What the send loop decided about one request, handed to `_send`."""

    index: int
    scheduled_s: float
    queue_s: float
    run_start: float  # perf_counter time of the run's start
    sent_at: float  # perf_counter time it was sent: the instant the loop checked the deadline against
    release: Callable[[], None] | None = None  # frees its concurrency slot when it ends


def _schedule(specs: Sequence[RequestSpec], config: RunConfig) -> Iterable[RequestSpec]:
    if config.mode == "concurrency" and config.duration_s is not None:
        return itertools.cycle(specs)
    return specs


def _past_deadline(config: RunConfig, elapsed_s: float) -> bool:
    return config.duration_s is not None and elapsed_s >= config.duration_s


async def _warm_up(target: Target, specs: Sequence[RequestSpec], prompts: PromptSynthesizer,
                   config: RunConfig) -> tuple[RequestRecord, ...]:
    if config.warmup_requests == 0:
        return ()
    slots = asyncio.Semaphore(config.max_concurrency or config.warmup_requests)
    chosen = itertools.islice(itertools.cycle(specs), config.warmup_requests)

    async def one(index: int, spec: RequestSpec) -> RequestRecord:
        async with slots:
            prompt = prompts.prompt(spec, index, warmup=True)
            now = time.perf_counter()
            sending = _Sending(index, 0.0, 0.0, now, now)
            return await _send(target, prompt, spec, sending, config.request_timeout_s)

    return tuple(await asyncio.gather(*(one(i, s) for i, s in enumerate(chosen))))


async def _send(target: Target, prompt: Prompt, spec: RequestSpec, sending: _Sending, timeout_s: float,
                on_done: OnDone | None = None) -> RequestRecord:
    sent = sending.sent_at
    times: list[float] = []
    counted_tokens, usage_tokens, phases = 0, None, None
    status: Status = "ok"
    error = ""
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline, aclosing(target.generate(prompt)) as stream:
            async for delta in stream:
                now = time.perf_counter()
                if delta.content:
                    times.append(now - sent)
                    counted_tokens += delta.num_tokens if delta.num_tokens is not None else 1
                usage_tokens = delta.completion_tokens if delta.completion_tokens is not None else usage_tokens
                phases = delta.phases or phases
        if not times:
            status, error = "error", "the stream ended without any generated output"
    except TimeoutError as timed_out:
        status = "timeout" if deadline.expired() else "error"
        error = f"no complete response within {timeout_s:g} s" if deadline.expired() else _describe(timed_out)
    except Refused as refused:
        status, error = "refused", _describe(refused)
    except Exception as failure:  # recorded against the request, never dropped
        status, error = "error", _describe(failure)
    finally:
        if sending.release is not None:
            sending.release()
    record = RequestRecord(
        index=sending.index, scheduled_s=sending.scheduled_s, sent_s=sent - sending.run_start,
        client_queue_s=sending.queue_s, prompt_tokens=len(prompt.token_ids), requested_output_tokens=spec.output_tokens,
        status=status, error=error, output_tokens=usage_tokens if usage_tokens is not None else counted_tokens,
        chunk_times_s=tuple(times), phases=phases,
    )
    if on_done is not None:
        on_done(record)
    return record


def _describe(failure: BaseException) -> str:
    text = str(failure)
    return f"{type(failure).__name__}: {text}" if text else type(failure).__name__
