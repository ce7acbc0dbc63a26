"""The kinds of simulated engine instance, each a step loop driven by the event loop.

Protocol with the loop: `start_step(now)` returns the step's end time (or None when there is
nothing to run or a step is already running); `finish_step(now)` applies the step and returns
what happened (`StepDone`). Scheduling mirrors vLLM v1: FCFS, running work first, chunked prefill
within a token budget, at most `max_num_seqs` requests admitted, head-of-line blocking on KV blocks.
(The hybrid pools' decode instance, a colocated one that also takes pulled KV, is in `hybrid`.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.perf_model import PerfModel
from planner.simulator.config import JOIN_WARMUP_PAY_SHARE, SimSettings
from planner.simulator.spread import jittered
from planner.simulator.state import DecodeBatch, ItlLog, SimRequest

Chunk = tuple[SimRequest, int]


@dataclass
class StepDone:
    """What one step did: `prefilled`: prompts whose first token it produced; `finished`: requests
    whose last token it produced (a one-token request computed here is in both); `transfers`: KV
    pulls that start now (blocks freed by the step let them in)."""

    prefilled: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)
    transfers: list[SimRequest] = field(default_factory=list)


def engine_sees_at_step_end(step_start_s: float | None) -> bool:
    """Whether a request handed to an engine now waits for the running step's end before its KV
    pull can start: vLLM's engine core takes new requests between steps and its scheduler puts a
    pull into the next step's connector metadata; an idle engine (no step running) takes it at once."""
    return step_start_s is not None


class KvLink:
    """An instance's inbound KV link: pulls into one instance are serialized, each taking
    `transfer_s(whole blocks of its prompt)`."""

    def __init__(self, settings: SimSettings, model: PerfModel) -> None:
        self._settings, self._model = settings, model
        self._free_s = 0.0

    def pull(self, request: SimRequest, now: float) -> None:
        """Sets the request's transfer start and end: when the link is free, and that plus the pull."""
        s = self._settings
        request.transfer_start_s = max(now, self._free_s)
        kv_bytes = s.kv_bytes_for(request.prompt_tokens)
        request.transfer_end_s = request.transfer_start_s + self._model.transfer_s(kv_bytes, s.transport)
        self._free_s = request.transfer_end_s


class ChunkWork(NamedTuple):
    """What a step's prompt chunks compute, in `PerfModel.prefill_step_s`'s terms: tokens, attention
    units sum((s+k)^2 - s^2) and prior units sum(k * s) over the chunks [s, s + k)."""
    tokens: int = 0
    attention_units: float = 0.0
    prior_units: float = 0.0

    def plus(self, other: ChunkWork) -> ChunkWork:
        return ChunkWork(self.tokens + other.tokens, self.attention_units + other.attention_units,
                         self.prior_units + other.prior_units)


def plan_chunks(queue: Iterable[SimRequest], budget: int, max_seqs: int, now: float,
                plan: list[Chunk]) -> ChunkWork:
    """Give FCFS chunks of `queue` up to `budget` tokens, appending (request, tokens) to `plan`.
    Returns what they compute. Every planned request but the last completes its prompt."""
    tokens, units, prior = 0, 0.0, 0.0
    for request in queue:
        if budget <= 0 or len(plan) >= max_seqs:
            break
        start = request.prefilled_tokens
        chunk = min(request.prompt_tokens - start, budget)
        plan.append((request, chunk))
        tokens += chunk
        budget -= chunk
        units += (start + chunk) ** 2 - start**2
        prior += chunk * start
        if request.prefill_start_s is None:
            request.prefill_start_s = now
    return ChunkWork(tokens, units, prior)


def apply_chunks(queue: deque[SimRequest], plan: list[Chunk], now: float) -> list[SimRequest]:
    """Credit the planned chunks; pop and return the requests whose prompt is now complete
    (their first token is sampled at the end of this step)."""
    completed = []
    for request, chunk in plan:
        request.prefilled_tokens += chunk
        if request.prefilled_tokens == request.prompt_tokens:
            if queue[0] is request:  # FCFS: completed requests are at the front
                queue.popleft()
            else:
                queue.remove(request)
            request.first_token_s = now
            completed.append(request)
    return completed


class PrefillInstance:
    """Prefill only; a request is in flight here until its first token."""

    def __init__(self, index: int, settings: SimSettings, model: PerfModel) -> None:
        self.index, self._settings, self._model = index, settings, model
        self.queue: deque[SimRequest] = deque()
        self.busy_s = 0.0
        self.step_tokens = 0  # tokens the last finished step emitted
        self._plan: list[Chunk] = []
        self._running = False
        self.engine_step_s = 0.0  # the model's step (no serving CPU, no stretch) of the running or last step

    def enqueue(self, request: SimRequest) -> None:
        self.queue.append(request)

    def start_step(self, now: float, stretch: float = 1.0, extra_s: float = 0.0,
                   corun: tuple[float, float] = (1.0, 1.0), floor: tuple[float, float] = (1.0, 0.0)) -> float | None:
        """Plans the next step; `stretch` >= 1 is how much the host's other load slows it, and
        `corun` (a prompt's, a decode step's) how much another instance stepping beside it does. A
        prefill step emits no decode token: `extra_s`, the decode step's drawn spread, is not its.
        `floor` (stretch, lost_s): the step of t takes at least lost_s + stretch x t
        (`SimSettings.prompt_loss_at`: measured beside the decode engine's steps, so the co-run
        stretch is in it already and not applied to it again)."""
        if self._running or not self.queue:
            return None
        s = self._settings
        fresh = [r for r in self.queue if r.prefill_start_s is None]  # before plan_chunks stamps them
        work = plan_chunks(self.queue, s.token_budget, s.max_num_seqs, now, self._plan)
        worker_cpu_s = sum(s.serving.prefill_request_cpu_s(r.prompt_tokens) for r in fresh if r.prefill_start_s is not None)
        self.engine_step_s = self._model.prefill_step_s(*work)
        step_s = self.engine_step_s + worker_cpu_s
        duration = max(corun[0] * stretch * step_s, floor[1] + floor[0] * step_s)
        self._running, self.busy_s = True, self.busy_s + duration
        return now + duration

    def finish_step(self, now: float) -> StepDone:
        """`prefilled`: the requests whose first token this step produced (nothing finishes here)."""
        completed = apply_chunks(self.queue, self._plan, now)
        self._plan, self._running = [], False
        self.step_tokens = len(completed)
        return StepDone(prefilled=completed)


def warmup_owed_s(left_s: float, joins_s: Iterable[float]) -> float:
    """What a decode instance owes its next steps for joins' warm-up when `left_s` is left of the
    earlier joins' and this step's joins bring `joins_s` each: the largest (joins close together
    overlap; `SimSettings.join_warmup`). Pure."""
    return max(left_s, *joins_s, 0.0)


class DecodeInstance:
    """Decode only. A request waits for KV blocks, pulls its KV over the instance's `KvLink`, joins
    the running batch at the first step boundary after its pull.

    As vLLM's engine core with a KV connector (`kv_transfer.connector`) does: a request handed over
    while a step runs is seen when that step ends, its pull is scheduled then and runs beside the
    next step, and it computes in the step after the one its pull finished in; handed to an idle
    engine, its pull starts once the engine core is awake (`ServingCosts.idle_join_s`). So under a running batch the first decode token comes one
    step later than the pull alone would put it (`engine_sees_at_step_end`). The steps after a
    join pay its warm-up (`SimSettings.join_warmup`)."""

    def __init__(self, index: int, settings: SimSettings, model: PerfModel, itl: ItlLog) -> None:
        self.index, self._settings, self._model, self._itl = index, settings, model, itl
        self.waiting: deque[SimRequest] = deque()
        self.batch = DecodeBatch()
        self.used_blocks = 0
        self.admitted = 0
        self.busy_s = 0.0
        self.step_tokens = 0  # tokens the running (or last) step emits
        self._link = KvLink(settings, model)
        self._ready: list[SimRequest] = []
        self._first_step: list[SimRequest] = []
        self._step_start_s: float | None = None
        self._owed_s = 0.0  # what the drawn spread could not take from the last step (`jittered`)
        self._warmup_owed_s = 0.0  # the join warm-up its batch's joins left to pay (`SimSettings.join_warmup`)
        # each step as it started: (start s, duration s, the model's step plus the served line s, batch,
        # joins); the line whatever `SimSettings.served_step` charges: the yardstick a traced step is read against
        self.steps: list[tuple[float, float, float, int, int]] = []

    def kv_blocks_free(self) -> int:
        return self._settings.num_kv_blocks - self.used_blocks

    def receive(self, request: SimRequest, now: float) -> list[SimRequest]:
        """Queue a prefilled request; returns the requests whose transfer starts now (none while a
        step runs: `finish_step` admits them; to an idle engine, `idle_join_s` from now)."""
        self.waiting.append(request)
        if engine_sees_at_step_end(self._step_start_s):
            return []
        return self._admit(now + (self._settings.serving.idle_join_s if self.admitted == 0 else 0.0))

    def _admit(self, now: float) -> list[SimRequest]:
        s, started = self._settings, []
        while self.waiting and self.admitted < s.max_num_seqs:
            request = self.waiting[0]
            blocks = s.blocks_for(request.prompt_tokens + request.output_tokens)
            if self.used_blocks + blocks > s.num_kv_blocks:
                break
            self.waiting.popleft()
            request.blocks, self.used_blocks, self.admitted = blocks, self.used_blocks + blocks, self.admitted + 1
            self._link.pull(request, now)
            started.append(request)
        return started

    def transfer_done(self, request: SimRequest) -> None:
        self._ready.append(request)

    def start_step(self, now: float, stretch: float = 1.0, extra_s: float = 0.0,
                   corun: tuple[float, float] = (1.0, 1.0)) -> float | None:
        """Plans the next step; `stretch` >= 1 is how much the host's other load slows it, `corun`
        (a prompt's, a decode step's) how much another instance stepping beside it does, and
        `extra_s` the served step's drawn spread (`planner.simulator.spread`)."""
        if self._step_start_s is not None:
            return None
        for request in self._ready:
            self.batch.join(request, request.output_tokens - 1, request.prompt_tokens + 1)
        self._first_step, self._ready = self._ready, []
        if self.batch.size == 0:
            return None
        size, serving = self.batch.size, self._settings.serving
        warmup_s = self._warmup_owed_s * JOIN_WARMUP_PAY_SHARE   # the earlier joins', from the step after theirs
        self._warmup_owed_s = warmup_owed_s(self._warmup_owed_s - warmup_s, [
            self._settings.join_warmup_cost_s(r.prompt_tokens + 1) for r in self._first_step])
        engine_s = self._model.decode_step_s(size, self.batch.context_tokens)
        modelled_s = stretch * corun[1] * (engine_s + serving.decode_serving_s(size, self._settings.served_step == "table")
                                           + sum(serving.decode_request_cpu_s(r.prompt_tokens) for r in self._first_step)
                                           + warmup_s)
        duration, self._owed_s = jittered(modelled_s, extra_s, self._owed_s, self._settings.step_spread == "carried")
        self._step_start_s, self.busy_s, self.step_tokens = now, self.busy_s + duration, size
        # read against the traced steps' yardstick, the served line whatever `served_step` charges
        self.steps.append((now, duration, engine_s + serving.decode_serving_s(size, by_batch=False), size,
                           len(self._first_step)))
        return now + duration

    def finish_step(self, now: float) -> StepDone:
        """`finished` requests, and the `transfers` that start now."""
        self._itl.record_step(now - self._step_start_s, self.batch.size - len(self._first_step))
        for request in self._first_step:
            request.first_decode_token_s = now
        finished = self.batch.advance()
        for request in finished:
            request.finish_s = now
            self.used_blocks -= request.blocks
            self.admitted -= 1
        if self.batch.size == 0:
            self._warmup_owed_s = 0.0   # the requests that owed it have ended
        self._step_start_s, self._first_step = None, []
        return StepDone(finished=finished, transfers=self._admit(now))


class ColocatedInstance:
    """vLLM alone: decodes (one token each) and prefill chunks share a step's token budget.
    A request reserves its whole sequence's blocks when it is first scheduled."""

    def __init__(self, index: int, settings: SimSettings, model: PerfModel, itl: ItlLog) -> None:
        self.index, self._settings, self._model, self._itl = index, settings, model, itl
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: deque[SimRequest] = deque()
        self.batch = DecodeBatch()
        self.used_blocks = 0
        self.busy_s = 0.0
        self.step_tokens = 0  # tokens the last finished step emitted
        self._ready: list[SimRequest] = []
        self._first_step: list[SimRequest] = []
        self._plan: list[Chunk] = []
        self._step_start_s: float | None = None
        self._owed_s = 0.0  # what the drawn spread could not take from the last step (`jittered`)

    def kv_blocks_free(self) -> int:
        return self._settings.num_kv_blocks - self.used_blocks

    def enqueue(self, request: SimRequest) -> None:
        """A prompt to compute here (and then decode)."""
        self.waiting.append(request)

    def admitted(self) -> int:
        """Requests holding a `max_num_seqs` slot: prefilling, about to join the batch, in it."""
        return len(self.prefilling) + self.batch.size + len(self._ready)

    def _admit_one(self) -> bool:
        s, request = self._settings, self.waiting[0]
        blocks = s.blocks_for(request.prompt_tokens + request.output_tokens)
        if self.used_blocks + blocks > s.num_kv_blocks or self.admitted() >= s.max_num_seqs:
            return False
        self.prefilling.append(self.waiting.popleft())
        request.blocks, self.used_blocks = blocks, self.used_blocks + blocks
        return True

    def start_step(self, now: float, stretch: float = 1.0, extra_s: float = 0.0,
                   corun: tuple[float, float] = (1.0, 1.0)) -> float | None:
        """Plans the next step; `stretch` >= 1 is how much the host's other load slows it, `corun`
        (a prompt's, a decode step's) how much another instance stepping beside it does (a step
        with a prompt chunk takes the prompt's, a decode-only step the decode step's), and
        `extra_s` the served decode step's drawn spread, charged when the step decodes."""
        if self._step_start_s is not None:
            return None
        for request in self._ready:
            self.batch.join(request, request.output_tokens - 1, request.prompt_tokens + 1)
        self._first_step, self._ready = self._ready, []
        s = self._settings
        budget = s.token_budget - self.batch.size
        work = plan_chunks(self.prefilling, budget, s.max_num_seqs, now, self._plan)
        while self.waiting and work.tokens < budget and self._admit_one():
            work = work.plus(plan_chunks((self.prefilling[-1],), budget - work.tokens, s.max_num_seqs, now, self._plan))
        if work.tokens == 0 and self.batch.size == 0:
            return None
        duration = stretch * corun[0 if work.tokens else 1] * (
            self._model.mixed_step_s(work.tokens, work.attention_units, self.batch.size, self.batch.context_tokens,
                                     work.prior_units)
            + s.serving.decode_serving_s(self.batch.size, s.served_step == "table")
            + sum(s.serving.decode_request_cpu_s(r.prompt_tokens) for r in self._first_step))
        if self.batch.size:
            duration, self._owed_s = jittered(duration, extra_s, self._owed_s, s.step_spread == "carried")
        self._step_start_s, self.busy_s = now, self.busy_s + duration
        return now + duration

    def finish_step(self, now: float) -> StepDone:
        """`prefilled`: prompts computed by this step; `finished`: requests whose last token it made."""
        if self.batch.size:
            self._itl.record_step(now - self._step_start_s, self.batch.size - len(self._first_step))
        for request in self._first_step:
            request.first_decode_token_s = now
        self.step_tokens = self.batch.size
        finished = self.batch.advance()
        prefilled = apply_chunks(self.prefilling, self._plan, now)
        for request in prefilled:
            self.step_tokens += 1
            request.handed_off_s = request.transfer_start_s = request.transfer_end_s = now
            if request.output_tokens == 1:
                request.first_decode_token_s = now
                finished.append(request)
            else:
                self._ready.append(request)
        for request in finished:
            request.finish_s = now
            self.used_blocks -= request.blocks
        self._step_start_s, self._plan, self._first_step = None, [], []
        return StepDone(prefilled=prefilled, finished=finished)
