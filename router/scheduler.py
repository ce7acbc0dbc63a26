"""Admission, the dispatch queue and placement: the adapter between live state and the pure policies.

    arrival  -> check(request): refuse at once (Overloaded + retry_after_s) when its predicted TTFT
                misses the SLO by more than the policy allows; nothing is queued or sent then
    dispatch -> the request waits in the router's queue (SLO class, then shortest prompt first, with
                aging: `router.policies.ordering`) until it is at the head and a path's computing
                worker is open (`gate.dispatch_open`); the best open placement is taken
    first token -> `prefilled(ticket, ...)`: the worker's queue shrinks, the cost fit learns
    end      -> `finish(ticket, ...)`: the prefix index learns what the workers now hold, and the
                calibration what the request saw against what admission predicted for it

Every decision is made by `router.policies`; this module only gathers state, waits and keeps books.
A ticket's queued tokens are released exactly once (`prefilled` or `finish`, whichever comes
first), so a cancelled or failed request never leaves a worker looking busy.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from pdserve import metrics
from pdserve.errors import NoHealthyWorker, Overloaded
from pdserve.roles import Topology
from pdserve.timings import Timings
from router.live_view import LiveView
from router.policies.admission import Refuse, Scale, admit, refusal_counts
from router.policies.calibration import Calibration, observe_served
from router.policies.ordering import DispatchQueue, QueuedItem, priority_key, queue_share
from router.policies.placement import (CostModel, OnlinePrefillFit, Placement, PlacementConfig, Prediction,
                                       RequestView, dispatch_open, evaluate)
from router.pool import WorkerPool
from router.types import GenerationRequest

# A prior for the cost model until the router has observed prefills of a few sizes (one CPU core,
# a ~100M-parameter model); `--cost-model FILE` replaces it with measured coefficients.
DEFAULT_COST = CostModel(fixed_s=0.02, per_token_s=0.0005, step_fixed_s=0.015, step_per_seq_s=0.001,
                         transfer_fixed_s=0.005, transfer_per_token_s=1e-6, local_interference_per_decode=0.05)
NOMINAL_TTFT_SLO_S = 10.0   # placement's yardstick when no TTFT SLO is set (admission then never refuses)
NOMINAL_TPOT_SLO_S = 0.2
RECHECK_S = 0.1             # the queue is re-pumped this often (workers come and go, KV frees up)
REFIT_EVERY = 8             # observed prefills between refits of the cost model
REFUSAL_LOG_EVERY_S = 5.0   # admission's refusals are logged at most this often (a summary line)

logger = logging.getLogger(__name__)


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
    max_queue_wait_s: float = 600.0   # a request waits at most this long in the router's queue

    def __post_init__(self) -> None:
        if not self.max_queue_wait_s > 0:
            raise ValueError(f"max_queue_wait_s must be > 0 seconds, got {self.max_queue_wait_s}")


@dataclass
class Ticket:
    """One dispatched request: where it goes, and the books to settle when its prompt is done.
    `taken`: its waiter received it (else `_forget` settles it: the waiter was cancelled meanwhile)."""

    request_id: str
    placement: Placement
    computing_id: str
    queued_tokens: int
    expected: Prediction | None = None   # admission's prediction when it queued (router queue included)
    # the worker's dispatched_prompts count with this prompt, and whether others were queued there
    # before it: a prompt computed alone is one whose worker saw neither (`Scheduler.computed_alone`)
    dispatch_number: int = 0
    queued_behind_others: bool = False
    settled: bool = False
    taken: bool = False
    closed: bool = False   # its decode worker's count of assigned requests was given back


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: WorkerPool, clock: Callable[[], float] = time.monotonic):
        self.config, self.pool, self.clock = config, pool, clock
        self.live = LiveView(pool, config.topology, config.placement)
        self.fit = OnlinePrefillFit()
        self.cost = config.cost_prior
        self.queue = DispatchQueue(self.cost, config.placement)
        self.calibration = {quantity: Calibration(config.placement.calibration()) for quantity in ("ttft", "tpot")
                            } if config.placement.calibration_quantile > 0 else {}
        # queue key -> (request, its waiter, admission's prediction for it)
        self._waiting: dict[str, tuple[GenerationRequest, asyncio.Future, Prediction | None]] = {}
        self._sequence = itertools.count()   # queue keys are private: clients may reuse request ids
        self._ticker: asyncio.Task | None = None
        self._refused_since_log: collections.Counter[str] = collections.Counter()   # Refuse.by -> count
        self._refusal_logged_s = -math.inf

    # ---- decisions over live state ---------------------------------------------------------------
    def request_view(self, request: GenerationRequest) -> RequestView:
        slo = self.config.slo
        return RequestView(len(request.prompt_token_ids), request.sampling.max_tokens,
                           slo.ttft_s or NOMINAL_TTFT_SLO_S, slo.tpot_s or NOMINAL_TPOT_SLO_S, request.slo_class)

    def ranked(self, request: GenerationRequest, queued_ahead: tuple[int, int] = (0, 0)) -> tuple[list[Placement], dict]:
        """Every placement the policy allows now, best first, and the views it was made on (by
        worker id). The router's queue ahead of the request, (prompt tokens, prompts), is spread over
        the workers that compute prompts. With no prefill worker alive, a decode worker is the only
        way: no local cap then."""
        views = self.live.views(request.prompt_token_ids, *queue_share(*queued_ahead, self.live.computing_workers()),
                                cache_salt=request.cache_salt, now_s=self.clock())
        placement = self.config.placement
        if not any(view.role == "prefill" for view in views):
            placement = replace(placement, local_prefill_max_tokens=0)
        return evaluate(self.request_view(request), views, self.cost, placement), {v.worker_id: v for v in views}

    def check(self, request: GenerationRequest) -> None:
        """Raises Overloaded (with a retry time) when admission refuses `request` now: its scaled
        predicted TTFT misses the TTFT SLO, or its decode worker's step would miss the TPOT SLO.
        Without SLOs nothing is refused for load: the request waits in the router's queue (bounded
        by `max_queue_wait_s`), as it would in vLLM's."""
        slo = self.config.slo
        if slo.ttft_s is None and slo.tpot_s is None:
            return
        verdict = admit(self.expected(request), self.request_view(request), self.config.placement, self.scale(),
                        judge_ttft=slo.ttft_s is not None, judge_tpot=slo.tpot_s is not None)
        if isinstance(verdict, Refuse):
            self._log_refusal(verdict)
            raise Overloaded(f"the cluster cannot meet this request's SLOs now: {verdict.reason}",
                             retry_after_s=verdict.retry_after_s)

    def _log_refusal(self, verdict: Refuse) -> None:
        """Counts the refusal by what decided it (`pdserve_router_admission_refusals_total{by}`) and
        logs one line per `REFUSAL_LOG_EVERY_S` at most: how many were refused since the last, by
        what, and the latest's reason."""
        metrics.ADMISSION_REFUSALS.labels(verdict.by).inc()
        self._refused_since_log[verdict.by] += 1
        now_s = self.clock()
        if now_s - self._refusal_logged_s >= REFUSAL_LOG_EVERY_S:
            logger.info("admission refused %s since the last report; the latest: %s",
                        refusal_counts(self._refused_since_log), verdict.reason)
            self._refused_since_log.clear()
            self._refusal_logged_s = now_s

    def expected(self, request: GenerationRequest) -> Prediction | None:
        """The best placement's prediction for `request` if it joined the router's queue now (the
        prompts queued ahead of it included); None when no path can take it."""
        ranked, _ = self.ranked(request, self._queued_ahead(request))
        return ranked[0].prediction if ranked else None

    def scale(self) -> Scale:
        """What admission multiplies its predictions by: each calibration's factor (1 when off)."""
        now_s = self.clock()
        factors = {quantity: calibration.factor(now_s) for quantity, calibration in self.calibration.items()}
        return Scale(**factors)

    def calibration_rows(self) -> list[tuple[str, float, int]]:
        """(quantity, factor now, observations kept) per calibrated quantity, for the router's
        metrics (`pdserve.metrics.AdmissionCalibrationCollector`); none when no SLO is judged or
        the calibration is off. The factor is read first: reading it forgets what aged out."""
        if not self._any_slo():
            return []
        now_s = self.clock()
        return [(quantity, calibration.factor(now_s), len(calibration))
                for quantity, calibration in self.calibration.items()]

    def _queued_ahead(self, request: GenerationRequest) -> tuple[int, int]:
        """(prompt tokens, prompts) queued in the router that would go before `request` (a lower
        priority key)."""
        now = self.clock()
        mine = priority_key(QueuedItem("", request.slo_class, len(request.prompt_token_ids), now), now, self.cost,
                            self.config.placement)
        ahead = [item.num_prompt_tokens for item in self.queue.ordered(now)
                 if priority_key(item, now, self.cost, self.config.placement) <= mine]
        return sum(ahead), len(ahead)

    # ---- the dispatch queue ----------------------------------------------------------------------
    async def dispatch(self, request: GenerationRequest) -> Ticket:
        """Waits for the request's turn and an open worker; returns its ticket. Cancelling the wait
        removes the request from the queue; a wait beyond `max_queue_wait_s` raises Overloaded."""
        expected = self.expected(request) if self.calibration and self._any_slo() else None
        item = QueuedItem(f"{request.request_id}#{next(self._sequence)}", request.slo_class,
                          len(request.prompt_token_ids), self.clock())
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[item.request_id] = (request, waiter, expected)
        self.queue.push(item)
        self._pump()
        if item.request_id in self.queue and (self._ticker is None or self._ticker.done()):
            self._ticker = asyncio.create_task(self._tick_while_queued())
        try:
            async with asyncio.timeout(self.config.max_queue_wait_s):
                ticket = await asyncio.shield(waiter)
            ticket.taken = True
            return ticket
        except TimeoutError:
            raise Overloaded(f"the request waited {self.config.max_queue_wait_s:g} s in the router's queue for a "
                             f"worker", retry_after_s=self.config.placement.min_retry_after_s) from None
        finally:
            self._forget(item.request_id, waiter)

    def _forget(self, key: str, waiter: asyncio.Future) -> None:
        """The waiter is gone (served, cancelled or timed out): a ticket booked for it but never
        taken is settled at once, so its tokens never stay on the worker's books."""
        self._waiting.pop(key, None)
        if self.queue.remove(key):
            self._pump()
        elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            ticket = waiter.result()
            if ticket.taken is False:
                self._close(ticket)

    def _pump(self) -> None:
        """Dispatches, in priority order, every queued request that has an open path now (a request
        whose paths are all gated does not hold back one behind it whose path is open), and stops
        as soon as every worker that computes prompts is at its gate: nothing behind can go then,
        and ranking each queued request again (a placement and a prefix match each) is what a
        router under load spent most of its CPU on, on the prefill worker's core. Synchronous:
        nothing can interleave between booking a ticket and handing it to its waiter."""
        for item in self.queue.ordered(self.clock()):
            if not self._any_worker_open():
                return  # every worker that computes prompts is at its gate: nothing can go
            request, waiter, expected = self._waiting[item.request_id]
            if waiter.done():
                continue
            if not self.pool.workers("decode"):
                self.queue.remove(item.request_id)
                waiter.set_exception(NoHealthyWorker("no decode worker is alive"))
                continue
            ticket = self._open_ticket(request)
            if ticket is not None:
                ticket.expected = expected
                self.queue.remove(item.request_id)
                waiter.set_result(ticket)

    def _any_worker_open(self) -> bool:
        """Whether a worker that computes prompts is below its gate (none alive: the pump says why
        each request cannot go). A decode worker that takes no prompts is not one: counted, its
        empty queue kept the pump ranking every queued request on every arrival and settle."""
        limit = self.config.placement.max_queued_prefill_tokens_per_worker
        workers = self.live.computing_records()
        return limit == 0 or not workers or any(self.live.queued_prefill_tokens[w.worker_id] < limit for w in workers)

    def _open_ticket(self, request: GenerationRequest) -> Ticket | None:
        ranked, by_id = self.ranked(request)
        for placement in ranked:
            if dispatch_open(placement.path, by_id, self.config.placement):
                computing = placement.path.computing_id
                tokens = self.request_view(request).uncached_tokens(by_id[computing])
                behind_others = self.live.queued_prefill_prompts[computing] > 0
                number = self.live.booked(computing, tokens, self.clock())
                self.live.assigned_decodes[placement.path.decode_id] += 1
                return Ticket(request.request_id, placement, computing, tokens, dispatch_number=number,
                              queued_behind_others=behind_others)
        return None

    async def _tick_while_queued(self) -> None:
        """Re-pumps every `RECHECK_S` while anything is queued (workers come and go, KV frees up,
        the registry refreshes); arrivals and settled tickets pump at once, this is the backstop."""
        while len(self.queue):
            await asyncio.sleep(RECHECK_S)
            self._pump()

    # ---- books -------------------------------------------------------------------------------------
    def prefilled(self, ticket: Ticket, compute_s: float | None, computed_tokens: int | None = None) -> None:
        """The ticket's prompt is computed (its first token exists). `compute_s`: the prefill's own
        time, without queueing, when known; it feeds the cost fit when the prompt was computed
        alone on a prefill worker (`computed_alone`; a Local prefill shares its steps with decodes)."""
        alone = self.computed_alone(ticket)   # before settling: it reads the worker's books
        self._settle(ticket)
        if compute_s is None or not computed_tokens or computed_tokens < 1 or compute_s < 0 or not alone:
            return
        if ticket.computing_id in {w.worker_id for w in self.pool.workers("prefill")}:
            self.fit.observe(computed_tokens, compute_s)
            if len(self.fit) % REFIT_EVERY == 0:  # a refit is a small least-squares solve
                self.cost = self.fit.model(self.config.cost_prior)
                self.queue.cost = self.cost
                logger.debug("prefill cost refit from %d prompts computed alone: 512 tokens %.3f s, 2048 tokens "
                             "%.3f s (prior %.3f s, %.3f s)", len(self.fit), self.cost.prefill_s(512),
                             self.cost.prefill_s(2048), self.config.cost_prior.prefill_s(512),
                             self.config.cost_prior.prefill_s(2048))

    def computed_alone(self, ticket: Ticket) -> bool:
        """Whether, by this router's books, the ticket's prompt shared no engine step with another:
        nothing was queued on its worker when it was dispatched, and nothing was dispatched there
        after it until now (its first token). vLLM fills a step's token budget from every waiting
        prompt (chunked prefill), so a prompt dispatched beside another reports, as its own compute
        time, the other's tokens too: fitted, that inflates every prediction after it."""
        return not ticket.queued_behind_others and self.live.dispatched_prompts[ticket.computing_id] == \
            ticket.dispatch_number

    def finish(self, ticket: Ticket, workers_holding: Sequence[tuple[str, Sequence[int]]] = (),
               served: Timings | None = None, cache_salt: str = "") -> None:
        """The request is over (served, failed or cancelled). `workers_holding`: (worker id, tokens)
        whose KV that worker now holds in its prefix cache (under `cache_salt`, the request's),
        recorded in the prefix index. `served`:
        a served request's timings, which the calibration compares with admission's prediction."""
        self._close(ticket)
        for worker_id, token_ids in workers_holding:
            if token_ids:
                self.live.prefix(self._block_size()).record(worker_id, token_ids, cache_salt)
        if served is not None and ticket.expected is not None:
            self._calibrate(ticket.expected, served)

    def _calibrate(self, expected: Prediction, served: Timings) -> None:
        slo = self.config.slo
        observe_served(self.calibration, expected, served.ttft_s, served.e2e_s, served.output_tokens,
                       (slo.ttft_s or NOMINAL_TTFT_SLO_S, slo.tpot_s or NOMINAL_TPOT_SLO_S),
                       self.config.placement.calibrate_ttft, self.clock())

    def _any_slo(self) -> bool:
        return self.config.slo.ttft_s is not None or self.config.slo.tpot_s is not None

    def _close(self, ticket: Ticket) -> None:
        """The request will not run on its decode worker any more (served, failed, cancelled)."""
        self._settle(ticket)
        if not ticket.closed:
            ticket.closed = True
            decode_id = ticket.placement.path.decode_id
            self.live.assigned_decodes[decode_id] = max(0, self.live.assigned_decodes[decode_id] - 1)

    def _settle(self, ticket: Ticket) -> None:
        if ticket.settled:
            return
        ticket.settled = True
        self.live.settled(ticket.computing_id, ticket.dispatch_number, ticket.queued_tokens, self.clock())
        if len(self.queue):
            self._pump()

    def _block_size(self) -> int:
        workers = self.pool.workers("prefill") + self.pool.workers("decode")
        return next((w.block_size for w in workers if w.block_size), 32)
