"""Admission, the dispatch queue and placement: the adapter between live state and the pure policies.

    arrival  -> check(request): refuse at once (Overloaded + retry_after_s) when its predicted TTFT
                misses the SLO by more than the policy allows; nothing is queued or sent then
    dispatch -> the request waits in the router's queue (SLO class, then shortest prompt first, with
                aging: `router.policies.ordering`) until it is at the head and a path's computing
                worker is open (`gate.dispatch_open`); the best open placement is taken
    first token -> `prefilled(ticket, ...)`: the worker's queue shrinks, the cost fit learns
    end      -> `finish(ticket, ...)`: the prefix index learns what the workers now hold

Every decision is made by `router.policies`; this module only gathers state, waits and keeps books.
A ticket's queued tokens are released exactly once (`prefilled` or `finish`, whichever comes
first), so a cancelled or failed request never leaves a worker looking busy.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from pdserve.errors import NoHealthyWorker, Overloaded
from pdserve.roles import Topology
from router.live_view import LiveView
from router.policies.admission import Refuse, admit
from router.policies.ordering import DispatchQueue, QueuedItem
from router.policies.placement import (CostModel, OnlinePrefillFit, Placement, PlacementConfig, RequestView,
                                       dispatch_open, evaluate)
from router.pool import WorkerPool
from router.types import GenerationRequest

# A prior for the cost model until the router has observed prefills of a few sizes (one CPU core,
# a ~100M-parameter model); `--cost-model FILE` replaces it with measured coefficients.
DEFAULT_COST = CostModel(fixed_s=0.02, per_token_s=0.0005, step_fixed_s=0.015, step_per_seq_s=0.001,
                         transfer_fixed_s=0.005, transfer_per_token_s=1e-6, local_interference_per_decode=0.05)
NOMINAL_TTFT_SLO_S = 10.0   # placement's yardstick when no TTFT SLO is set (admission then never refuses)
NOMINAL_TPOT_SLO_S = 0.2
RECHECK_S = 0.1             # a waiting request re-reads the pools this often (workers come and go)


@dataclass(frozen=True)
class SloTargets:
    """The cluster's default SLOs; None: not set (no admission on that SLO)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"the {name.removesuffix('_s').upper()} SLO must be > 0 seconds, got {value}")


@dataclass(frozen=True)
class SchedulerConfig:
    topology: Topology = "disaggregated"
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    slo: SloTargets = SloTargets()
    cost_prior: CostModel = DEFAULT_COST


@dataclass
class Ticket:
    """One dispatched request: where it goes, and the books to settle when its prompt is done."""

    request_id: str
    placement: Placement
    computing_id: str
    queued_tokens: int
    settled: bool = False


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: WorkerPool, clock: Callable[[], float] = time.monotonic):
        self.config, self.pool, self.clock = config, pool, clock
        self.live = LiveView(pool, config.topology, config.placement)
        self.fit = OnlinePrefillFit()
        self.cost = config.cost_prior
        self.queue = DispatchQueue(self.cost, config.placement)
        self._changed = asyncio.Condition()
        self._notifying: set[asyncio.Task] = set()  # held so none is dropped before it runs

    # ---- decisions over live state ---------------------------------------------------------------
    def request_view(self, request: GenerationRequest) -> RequestView:
        slo = self.config.slo
        return RequestView(len(request.prompt_token_ids), request.sampling.max_tokens,
                           slo.ttft_s or NOMINAL_TTFT_SLO_S, slo.tpot_s or NOMINAL_TPOT_SLO_S, request.slo_class)

    def ranked(self, request: GenerationRequest, queued_ahead_tokens: int = 0) -> list[Placement]:
        """Every placement the policy allows now, best first; the router's queue ahead of the
        request is spread over the workers that compute prompts."""
        share = queued_ahead_tokens // max(1, self.live.computing_workers())
        views = self.live.views(request.prompt_token_ids, share)
        return evaluate(self.request_view(request), views, self.cost, self.config.placement)

    def check(self, request: GenerationRequest) -> None:
        """Raises Overloaded (with the predicted drain time) when admission refuses `request` now,
        NoHealthyWorker when no worker could take it at all. Without a TTFT SLO nothing is refused
        for load (the cluster then queues like vLLM does)."""
        ahead = sum(item.num_prompt_tokens for item in self.queue.ordered(self.clock())
                    if self.config.placement.rank_of(item.slo_class) <= self.config.placement.rank_of(request.slo_class))
        ranked = self.ranked(request, ahead)
        if not ranked:
            raise NoHealthyWorker("no decode worker can take the request (none alive, or none with KV room for "
                                  "its prompt and max_tokens)")
        if self.config.slo.ttft_s is None:
            return
        verdict = admit(ranked[0].prediction, self.request_view(request), self.config.placement)
        if isinstance(verdict, Refuse):
            raise Overloaded(f"the cluster cannot meet this request's time to first token now: {verdict.reason}",
                             retry_after_s=verdict.retry_after_s)

    # ---- the dispatch queue ----------------------------------------------------------------------
    async def dispatch(self, request: GenerationRequest) -> Ticket:
        """Waits for the request's turn and an open worker; returns its ticket. Cancelling the wait
        removes it from the queue."""
        item = QueuedItem(request.request_id, request.slo_class, len(request.prompt_token_ids), self.clock())
        self.queue.push(item)
        try:
            while True:
                if self.queue.peek(self.clock()) is item:
                    ticket = self._try_dispatch(request)
                    if ticket is not None:
                        return ticket
                await self._wait_for_change()
        finally:
            self.queue.remove(item.request_id)  # still queued when the wait was cancelled or failed
            await self._notify()  # whether it left or went, the next in line may go now

    def _try_dispatch(self, request: GenerationRequest) -> Ticket | None:
        ranked = self.ranked(request)
        if not ranked:
            raise NoHealthyWorker("no decode worker is alive")
        by_id = {v.worker_id: v for v in self.live.views(request.prompt_token_ids)}
        for placement in ranked:
            if dispatch_open(placement.path, by_id, self.config.placement):
                computing = placement.path.computing_id
                tokens = len(request.prompt_token_ids) - by_id[computing].cached_prefix_tokens
                self.live.queued_prefill_tokens[computing] += tokens
                self.queue.remove(request.request_id)
                return Ticket(request.request_id, placement, computing, tokens)
        return None

    async def _wait_for_change(self) -> None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), RECHECK_S)
            except TimeoutError:
                pass

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ---- books -------------------------------------------------------------------------------------
    def prefilled(self, ticket: Ticket, compute_s: float | None, computed_tokens: int | None = None) -> None:
        """The ticket's prompt is computed (its first token exists). `compute_s`: the prefill's own
        time, without queueing, when known; it feeds the cost fit (prefill workers only: a Local
        prefill shares its steps with decodes and would bias it)."""
        self._settle(ticket)
        if compute_s is not None and computed_tokens and ticket.computing_id in {
                w.worker_id for w in self.pool.workers("prefill")}:
            self.fit.observe(computed_tokens, compute_s)
            self.cost = self.fit.model(self.config.cost_prior)
            self.queue.cost = self.cost

    def finish(self, ticket: Ticket, workers_holding: Sequence[tuple[str, Sequence[int]]] = ()) -> None:
        """The request is over (served, failed or cancelled). `workers_holding`: (worker id, tokens)
        whose KV that worker now holds in its prefix cache, recorded in the prefix index."""
        self._settle(ticket)
        for worker_id, token_ids in workers_holding:
            if token_ids:
                self.live.prefix(self._block_size()).record(worker_id, token_ids)

    def _settle(self, ticket: Ticket) -> None:
        if ticket.settled:
            return
        ticket.settled = True
        left = self.live.queued_prefill_tokens[ticket.computing_id] - ticket.queued_tokens
        self.live.queued_prefill_tokens[ticket.computing_id] = max(0, left)
        self._notify_soon()

    def _notify_soon(self) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._notify())
        except RuntimeError:  # no loop (a unit test's synchronous call): nobody can be waiting
            return
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    def _block_size(self) -> int:
        workers = self.pool.workers("prefill") + self.pool.workers("decode")
        return next((w.block_size for w in workers if w.block_size), 32)
