"""The router in the simulator: `router/scheduler.py`'s dispatch, run on simulated instances.

Every request is placed by the router's own decision code, the way `router.scheduler` and
`router.live_view` call it:
- on arrival, with an SLO set, admission (`Scheduler.check`) judges it: the router's queue ahead
  of it (the waiting requests whose `priority_key` is at most its own) spread over the workers
  that compute prompts (`ordering.queue_share`), the best placement's prediction on those views
  (`placement.evaluate`), and `admission.admit` on it (TTFT judged with a TTFT SLO set, the decode
  step with a TPOT SLO set); a refused request is marked `refused` and never queued;
- an admitted request joins the router's queue, in `router.policies.ordering.priority_key` order (SLO
  class, shortest prompt first, aging);
- a pump (`Scheduler._pump`) goes through the queue in that order and sends every request that
  has an open path: `placement.evaluate` over one `WorkerView` per instance, the best-ranked path
  whose computing worker `placement.dispatch_open` lets in; a request with none waits, and does not
  hold back one behind it whose path is open;
- `router.live_view.LocalPrefillRule` says whether decode workers accept Local prompts.
The books are the router's: `queued_prefill_tokens[worker]`: prompt tokens sent there whose first
token the router has not seen (a prefill instance's: until the handoff; a decode instance's Local
prompts: until the step that computes them), the first of them computing since it was booked on
an idle worker or the one before it came back (`heads`); `running_decodes`: Decode calls in flight (a
Disaggregated path's from the handoff, a Local path's from dispatch, until the last token);
`kv_blocks_free`: the decode-side instance's blocks not reserved (prefill instances' KV is not
modelled: they report plenty, as a worker that reports no total does to the router).

Where the simulated router differs from a live one, on purpose:
- it pumps when something that can open a path changes (a first token, a finished request:
  gates and KV blocks), and on arrival looks only at the newcomers (nothing else changed for the
  requests already waiting); the router pumps on arrivals and first tokens and every 0.1 s;
- the queue is a list sorted on `priority_key(item, now_s=0)`: `priority_key(item, now)` is that
  minus `now` for every item alike, so its order is `DispatchQueue.ordered(now)`'s at every `now`;
- before `evaluate`, a request is skipped when no path could pass the hard filters and the gate
  (`_Openings.could_take`: a necessary condition; `evaluate` and `dispatch_open` decide);
- not a difference: admission scales the prediction by the router's own `Calibration`
  (`RouterSettings.calibrated`, the default; `PlacementConfig.calibration()`, where
  `calibration_quantile` > 0 and an SLO is judged), fed as `Scheduler._calibrate` feeds it: at
  each request's end, its TTFT and time per output token as the simulation served them (the hops'
  latency `delivery_s` included, the drawn spread not) against the best placement's prediction at
  its admission; `calibrated` False judges the prediction as it is (scale 1), a what-if;
  `RouterSettings.admission` False turns admission off (every request is served; one that no
  decode instance has KV room for waits, as the router does without SLOs);
- its counts are exact and current (a live router's KV counts are a heartbeat old), nothing is in
  a prefix cache (not modelled) and the cost model stays as given (no `OnlinePrefillFit`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import Protocol

from pdserve.roles import Topology as TopologyKind
from planner.simulator.state import SimRequest
from router.live_view import LocalPrefillRule
from router.policies.placement.head_of_queue import HeadOfQueue
from router.policies.admission import Admit, Scale, admit
from router.policies.calibration import Calibration, observe_served
from router.policies.ordering import QueuedItem, priority_key, queue_share
from router.policies.placement import (CostModel, Disaggregated, Local, Path, PlacementConfig, Prediction,
                                       RequestView, WorkerView, dispatch_open, evaluate)
from router.scheduler import NOMINAL_TPOT_SLO_S, NOMINAL_TTFT_SLO_S, SloTargets

UNMODELLED_KV_BLOCKS = 1 << 30  # what a worker reporting no KV total shows the router
Entry = tuple[float, float, str, SimRequest]  # (priority key at now 0, arrival, id, request)


class DecodeSide(Protocol):
    """A decode-role instance (decode, hybrid or colocated) as the router sees it."""

    def kv_blocks_free(self) -> int: ...


def prefill_id(index: int) -> str:
    return f"prefill-{index}"


def decode_id(index: int) -> str:
    return f"decode-{index}"


@dataclass(frozen=True)
class _Openings:
    """What the workers can take now, summed up from the views: whether a prefill worker is open,
    the most KV blocks free on any decode worker, and on any open decode worker that accepts Local
    prompts (-1: none)."""

    prefill_open: bool
    most_kv_free: int
    most_kv_free_local: int
    local_cap: int

    @property
    def none(self) -> bool:
        return not self.prefill_open and self.most_kv_free_local < 0

    def could_take(self, prompt_tokens: int, kv_blocks: int) -> bool:
        """False only when no path can pass `local_allowed`, `kv_fits` and `dispatch_open`."""
        if self.prefill_open and kv_blocks <= self.most_kv_free:
            return True
        return kv_blocks <= self.most_kv_free_local and (self.local_cap == 0 or prompt_tokens <= self.local_cap)


class SimRouter:
    """The router of one simulated cluster. The engine calls `arrive`, then `dispatch` after every
    event and enacts what it returns (each request's `prefill_instance` / `decode_instance` are set
    to the placement's), and reports `prefilled`, `decode_started` and `finished` as they happen.
    `slo`: the SLOs set on the router (placement aims at the nominal ones where not set); `admission`
    False: nothing is refused. Invariant: every count returns to 0 once every request admitted has
    finished; a refused request touches none of them."""

    def __init__(self, kind: TopologyKind, num_prefill: int, decode_side: Sequence[DecodeSide],
                 placement: PlacementConfig, cost: CostModel, slo: SloTargets, block_size: int,
                 admission: bool = True, delivery_s: float = 0.0, calibrated: bool = True) -> None:
        self.placement, self.cost = placement, cost
        self._slo_s = (slo.ttft_s or NOMINAL_TTFT_SLO_S, slo.tpot_s or NOMINAL_TPOT_SLO_S)
        self._judge = (admission and slo.ttft_s is not None, admission and slo.tpot_s is not None)  # (TTFT, TPOT)
        # `Scheduler.calibration`: what admission scales its predictions by, learned from the requests served
        self.calibration = ({quantity: Calibration(placement.calibration()) for quantity in ("ttft", "tpot")}
                            if calibrated and placement.calibration_quantile > 0 and any(self._judge) else {})
        self._expected: dict[int, Prediction] = {}  # request index -> the prediction it was admitted on
        self._delivery_s = delivery_s  # what the hops add to a first token, as the client (and router) see it
        self._block_size = block_size
        self._prefill_ids = [prefill_id(i) for i in range(num_prefill)]
        self._decode_side = {decode_id(i): instance for i, instance in enumerate(decode_side)}
        self._index = {worker: i for ids in (self._prefill_ids, list(self._decode_side))
                       for i, worker in enumerate(ids)}
        self._accepts_local = LocalPrefillRule(kind, placement.local_prefill_max_tokens).accepts(num_prefill > 0)
        # `LiveView.computing_workers`: the router's queue is spread over these
        self._computing_workers = num_prefill + (len(self._decode_side) if self._accepts_local else 0)
        self.queued_prefill_tokens: Counter[str] = Counter()
        self.queued_prefill_prompts: Counter[str] = Counter()
        self.heads = HeadOfQueue()   # `LiveView.heads`
        self.running_decodes: Counter[str] = Counter()
        self.now_s = 0.0   # the simulation's clock, set by the engine before each event
        self._queue: list[Entry] = []  # sorted: next first
        self._arrived: list[Entry] = []  # since the last pump
        self._changed = False  # books or KV changed since the last pump

    def __len__(self) -> int:
        """Requests waiting in the router's queue."""
        return len(self._queue)

    def arrive(self, request: SimRequest) -> bool:
        """`request` reaches the router: True, it joins the queue; False, admission refuses it (it is
        marked `refused`, and is over: the router answered it at once)."""
        item = QueuedItem(f"{request.index:09d}", "", request.prompt_tokens, request.arrival_s)
        entry = (priority_key(item, 0.0, self.cost, self.placement), item.arrived_s, item.request_id, request)
        if not self._admits(request, entry[0]):
            request.refused = True
            return False
        bisect.insort(self._queue, entry)
        self._arrived.append(entry)
        return True

    def dispatch(self) -> list[tuple[SimRequest, Path]]:
        """The pump: the requests the router sends now, in queue order, each with its path."""
        if not (self._changed or self._arrived):
            return []
        candidates = self._queue if self._changed else sorted(self._arrived)
        self._changed, self._arrived = False, []
        sent: list[tuple[SimRequest, Path]] = []
        views: list[WorkerView] | None = None  # built when needed: after a dispatch they are stale
        for entry in list(candidates):
            if views is None:
                views = self.views()
                openings = self._openings(views)
            if openings.none:
                break
            request = entry[-1]
            view = self._request_view(request)
            if not openings.could_take(request.prompt_tokens, view.kv_blocks_needed(self._block_size)):
                continue
            path = self._open_path(view, views)
            if path is not None:
                del self._queue[bisect.bisect_left(self._queue, entry)]
                self._book(request, path)
                sent.append((request, path))
                views = None
        return sent

    def place_decode_again(self, request: SimRequest) -> None:
        """decode_pick "handoff": the best Disaggregated path from the request's prefill instance
        now, as the placement ranks it; the decode instance stays when none can take it."""
        prefill = prefill_id(request.prefill_instance)
        for placement in evaluate(self._request_view(request), self.views(), self.cost, self.placement):
            if isinstance(placement.path, Disaggregated) and placement.path.prefill_id == prefill:
                request.decode_instance = self._index[placement.path.decode_id]
                return

    def prefilled(self, request: SimRequest) -> None:
        """The router has the request's first token: its prompt leaves the computing worker's queue."""
        computing = (decode_id(request.decode_instance) if request.prefill_instance is None
                     else prefill_id(request.prefill_instance))
        self.queued_prefill_tokens[computing] -= request.prompt_tokens
        self.queued_prefill_prompts[computing] -= 1
        self.heads.settle(computing, request.index, self.now_s)
        self._changed = True

    def decode_started(self, request: SimRequest) -> None:
        """The Decode call of a prefilled request is sent (at its handoff)."""
        self.running_decodes[decode_id(request.decode_instance)] += 1

    def finished(self, request: SimRequest) -> None:
        """The request's last token is out of its decode instance (its KV blocks are free); the
        calibration learns from what it saw."""
        self.running_decodes[decode_id(request.decode_instance)] -= 1
        self._changed = True
        expected = self._expected.pop(request.index, None)
        if expected is not None and request.first_token_s is not None and request.finish_s is not None:
            self._calibrate(expected, request)

    def _calibrate(self, expected: Prediction, request: SimRequest) -> None:
        """`Scheduler._calibrate` on the simulated request's TTFT and E2EL as the client sees them."""
        delivery_s = self._delivery_s * request.hop_stretch + request.hop_wait_s
        observe_served(self.calibration, expected, request.first_token_s + delivery_s - request.arrival_s,
                       request.finish_s + delivery_s - request.arrival_s, request.output_tokens, self._slo_s,
                       self.placement.calibrate_ttft, self.now_s)

    def scale(self) -> Scale:
        """`Scheduler.scale`: each calibration's factor now (1 where it is off)."""
        return Scale(**{quantity: calibration.factor(self.now_s) for quantity, calibration in self.calibration.items()})

    def views(self, extra_queued_tokens: int = 0, extra_queued_prompts: int = 0) -> list[WorkerView]:
        """Every instance as the placement sees it (as `LiveView.views` builds them), with
        `extra_queued_tokens` in `extra_queued_prompts` prompts added to every instance's queue."""
        tokens, prompts = self.queued_prefill_tokens, self.queued_prefill_prompts
        views = [WorkerView(worker, "prefill", self._accepts_local, tokens[worker] + extra_queued_tokens, 0,
                            UNMODELLED_KV_BLOCKS, self._block_size,
                            queued_prefill_prompts=prompts[worker] + extra_queued_prompts,
                            **self.heads.view_fields(worker, self.now_s))
                 for worker in self._prefill_ids]
        views += [WorkerView(worker, "decode", self._accepts_local, tokens[worker] + extra_queued_tokens,
                             self.running_decodes[worker], max(0, instance.kv_blocks_free()), self._block_size,
                             queued_prefill_prompts=prompts[worker] + extra_queued_prompts,
                             **self.heads.view_fields(worker, self.now_s))
                  for worker, instance in self._decode_side.items()]
        return views

    def _admits(self, request: SimRequest, key: float) -> bool:
        """`Scheduler.check`: admission's verdict on `request` (whose `priority_key` at now 0 is
        `key`) with the router's queue ahead of it; True without an SLO judged."""
        judge_ttft, judge_tpot = self._judge
        if not (judge_ttft or judge_tpot):
            return True
        view = self._request_view(request)
        shared = queue_share(*self._queued_ahead(key), self._computing_workers)
        ranked = evaluate(view, self.views(*shared), self.cost, self.placement)
        verdict = admit(ranked[0].prediction if ranked else None, view, self.placement, self.scale(),
                        judge_ttft=judge_ttft, judge_tpot=judge_tpot)
        if isinstance(verdict, Admit) and self.calibration and ranked:
            self._expected[request.index] = ranked[0].prediction
        return isinstance(verdict, Admit)

    def _queued_ahead(self, key: float) -> tuple[int, int]:
        """`Scheduler._queued_ahead`: (prompt tokens, prompts) waiting in the router's queue that go
        before a newcomer of priority key `key` (their key is at most its own, both at now 0)."""
        ahead = [entry[-1].prompt_tokens for entry in takewhile(lambda entry: entry[0] <= key, self._queue)]
        return sum(ahead), len(ahead)

    def _openings(self, views: list[WorkerView]) -> _Openings:
        by_id = {view.worker_id: view for view in views}
        decode = [view for view in views if view.role == "decode"]
        prefill_open = bool(decode) and any(dispatch_open(Disaggregated(view.worker_id, decode[0].worker_id), by_id,
                                                          self.placement) for view in views if view.role == "prefill")
        local = [view.kv_blocks_free for view in decode
                 if view.accepts_local_prefill and dispatch_open(Local(view.worker_id), by_id, self.placement)]
        return _Openings(prefill_open, max((view.kv_blocks_free for view in decode), default=-1),
                         max(local, default=-1), self.placement.local_prefill_max_tokens)

    def _request_view(self, request: SimRequest) -> RequestView:
        return RequestView(request.prompt_tokens, request.output_tokens, *self._slo_s)

    def _open_path(self, request: RequestView, views: list[WorkerView]) -> Path | None:
        """`Scheduler._open_ticket`: the best-ranked placement whose computing worker is open."""
        by_id = {view.worker_id: view for view in views}
        for placement in evaluate(request, views, self.cost, self.placement):
            if dispatch_open(placement.path, by_id, self.placement):
                return placement.path
        return None

    def _book(self, request: SimRequest, path: Path) -> None:
        self.heads.book(path.computing_id, request.index, request.prompt_tokens, self.now_s)
        self.queued_prefill_tokens[path.computing_id] += request.prompt_tokens
        self.queued_prefill_prompts[path.computing_id] += 1
        request.decode_instance = self._index[path.decode_id]
        if isinstance(path, Local):
            request.prefill_instance = None
            self.running_decodes[path.decode_id] += 1  # the Decode call goes out now
        else:
            request.prefill_instance = self._index[path.prefill_id]
