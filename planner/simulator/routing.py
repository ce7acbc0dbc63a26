"""The router in the simulator: `router/scheduler.py`'s dispatch, run on simulated instances.

Every request is placed by the router's own decision code, the way `router.scheduler` and
`router.live_view` call it:
- on arrival it joins the router's queue, in `router.policies.ordering.priority_key` order (SLO
  class, shortest prompt first, aging);
- the head of the queue is placed with `placement.evaluate` over one `WorkerView` per instance and
  sent on the best path whose computing worker `placement.dispatch_open` lets in; when no path is
  open it waits, and everything behind it waits too;
- `router.live_view.LocalPrefillRule` says whether decode workers accept Local prompts.
The books are the router's: `queued_prefill_tokens[worker]`: prompt tokens sent there whose first
token the router has not seen (a prefill instance's: until the handoff; a decode instance's Local
prompts: until the step that computes them); `running_decodes`: Decode calls in flight (a
Disaggregated path's from the handoff, a Local path's from dispatch, until the last token);
`kv_blocks_free`: the decode-side instance's blocks not reserved (prefill instances' KV is not
modelled: they report plenty, as a worker that reports no total does to the router).

Where the simulated router differs from a live one, on purpose:
- its queue is a heap on `priority_key(item, now_s=0)`: `priority_key(item, now)` is that minus
  `now` for every item alike, so the heap's order is `DispatchQueue.ordered(now)`'s at every `now`
  (O(log n) a request instead of a sort per look);
- no admission (`router.policies.admission`): every request is served. When no path can take the
  head at all (no decode instance has KV blocks free for it), it waits for blocks, where the router
  would answer UNAVAILABLE;
- its counts are exact and current (a live router's KV counts are a heartbeat old), nothing is in
  a prefix cache (not modelled) and the cost model stays as given (no `OnlinePrefillFit`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from pdserve.roles import Topology as TopologyKind
from planner.simulator.state import SimRequest
from router.live_view import LocalPrefillRule
from router.policies.ordering import QueuedItem, priority_key
from router.policies.placement import (CostModel, Disaggregated, Local, Path, PlacementConfig, RequestView,
                                       WorkerView, dispatch_open, evaluate)

UNMODELLED_KV_BLOCKS = 1 << 30  # what a worker reporting no KV total shows the router


class DecodeSide(Protocol):
    """A decode-role instance (decode, hybrid or colocated) as the router sees it."""

    def kv_blocks_free(self) -> int: ...


def prefill_id(index: int) -> str:
    return f"prefill-{index}"


def decode_id(index: int) -> str:
    return f"decode-{index}"


class SimRouter:
    """The router of one simulated cluster. The engine calls `arrive`, then `dispatch` after every
    event and enacts what it returns (each request's `prefill_instance` / `decode_instance` are set
    to the placement's), and reports `prefilled`, `decode_started` and `finished` as they happen.
    Invariant: every count returns to 0 once every request has finished."""

    def __init__(self, kind: TopologyKind, num_prefill: int, decode_side: Sequence[DecodeSide],
                 placement: PlacementConfig, cost: CostModel, ttft_slo_s: float, tpot_slo_s: float,
                 block_size: int) -> None:
        self.placement, self.cost = placement, cost
        self._slo_s, self._block_size = (ttft_slo_s, tpot_slo_s), block_size
        self._prefill_ids = [prefill_id(i) for i in range(num_prefill)]
        self._decode_side = {decode_id(i): instance for i, instance in enumerate(decode_side)}
        self._index = {worker: i for ids in (self._prefill_ids, list(self._decode_side))
                       for i, worker in enumerate(ids)}
        self._accepts_local = LocalPrefillRule(kind, placement.local_prefill_max_tokens).accepts(num_prefill > 0)
        self.queued_prefill_tokens: Counter[str] = Counter()
        self.running_decodes: Counter[str] = Counter()
        self._queue: list[tuple[float, float, str, SimRequest]] = []
        self._changed = False

    def __len__(self) -> int:
        """Requests waiting in the router's queue."""
        return len(self._queue)

    def arrive(self, request: SimRequest) -> None:
        item = QueuedItem(f"{request.index:09d}", "", request.prompt_tokens, request.arrival_s)
        key = priority_key(item, 0.0, self.cost, self.placement)
        heapq.heappush(self._queue, (key, item.arrived_s, item.request_id, request))
        self._changed = True

    def dispatch(self) -> list[tuple[SimRequest, Path]]:
        """The requests the router sends now, in queue order, each with its path; it stops at the
        first that must wait. Looks again only when something changed since the last call."""
        sent: list[tuple[SimRequest, Path]] = []
        if not self._changed:
            return sent
        self._changed = False
        while self._queue:
            request = self._queue[0][-1]
            path = self._open_path(request)
            if path is None:
                break
            heapq.heappop(self._queue)
            self._book(request, path)
            sent.append((request, path))
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
        self._changed = True

    def decode_started(self, request: SimRequest) -> None:
        """The Decode call of a prefilled request is sent (at its handoff)."""
        self.running_decodes[decode_id(request.decode_instance)] += 1
        self._changed = True

    def finished(self, request: SimRequest) -> None:
        """The request's last token is out of its decode instance."""
        self.running_decodes[decode_id(request.decode_instance)] -= 1
        self._changed = True

    def views(self) -> list[WorkerView]:
        """Every instance as the placement sees it (built per look, as `LiveView.views` does)."""
        views = [WorkerView(worker, "prefill", self._accepts_local, self.queued_prefill_tokens[worker], 0,
                            UNMODELLED_KV_BLOCKS, self._block_size) for worker in self._prefill_ids]
        views += [WorkerView(worker, "decode", self._accepts_local, self.queued_prefill_tokens[worker],
                             self.running_decodes[worker], max(0, instance.kv_blocks_free()), self._block_size)
                  for worker, instance in self._decode_side.items()]
        return views

    def _request_view(self, request: SimRequest) -> RequestView:
        return RequestView(request.prompt_tokens, request.output_tokens, *self._slo_s)

    def _open_path(self, request: SimRequest) -> Path | None:
        """`Scheduler._try_dispatch`: the best-ranked placement whose computing worker is open."""
        views = self.views()
        by_id = {view.worker_id: view for view in views}
        for placement in evaluate(self._request_view(request), views, self.cost, self.placement):
            if dispatch_open(placement.path, by_id, self.placement):
                return placement.path
        return None

    def _book(self, request: SimRequest, path: Path) -> None:
        self.queued_prefill_tokens[path.computing_id] += request.prompt_tokens
        request.decode_instance = self._index[path.decode_id]
        if isinstance(path, Local):
            request.prefill_instance = None
            self.running_decodes[path.decode_id] += 1  # the Decode call goes out now
        else:
            request.prefill_instance = self._index[path.prefill_id]
