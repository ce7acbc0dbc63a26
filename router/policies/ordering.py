"""The order of the router's dispatch queue. Pure: the caller owns the clock.

    priority_key = class_rank * class_gap_s + prefill_s(num_prompt_tokens) - (now_s - arrived_s)

Lower goes sooner: a better class first, shorter prompts first within a class (shortest job first
minimises mean TTFT), and waiting lowers the key one for one, so nothing starves. As `now_s`
shifts every key equally, the order of two queued items never changes while they wait; what
aging buys is that a request is overtaken only by requests that arrive within
`overtake_window_s(item)` after it. Items arriving later queue behind it, so its wait is bounded
by the work queued ahead of it plus that window's arrivals. Ties: earlier arrival, then request id.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.policies.placement.config import PlacementConfig
from router.policies.placement.cost import CostModel


@dataclass(frozen=True)
class QueuedItem:
    request_id: str
    slo_class: str
    num_prompt_tokens: int
    arrived_s: float


def priority_key(item: QueuedItem, now_s: float, cost: CostModel, config: PlacementConfig) -> float:
    return (config.rank_of(item.slo_class) * config.class_gap_s + cost.prefill_s(item.num_prompt_tokens)
            - (now_s - item.arrived_s))


def overtake_window_s(item: QueuedItem, cost: CostModel, config: PlacementConfig) -> float:
    """The no-starvation bound: only requests arriving less than this many seconds after `item` can
    be dispatched before it (the best possible newcomer: the best class, a one-token prompt)."""
    best_rank = min(config.class_rank.values())
    return ((config.rank_of(item.slo_class) - best_rank) * config.class_gap_s
            + cost.prefill_s(item.num_prompt_tokens) - cost.prefill_s(1))


def queue_share(queued_tokens: int, queued_prompts: int, workers: int) -> tuple[int, int]:
    """One worker's share of the router's queue ahead of a request, (prompt tokens, prompts), when
    it is spread evenly over `workers` computing workers (at least one): what admission adds to
    each worker's own queue. Every prompt of a share keeps >= 1 token (`WorkerView`'s invariant)."""
    workers = max(1, workers)
    tokens = queued_tokens // workers
    return tokens, min(-(-queued_prompts // workers), tokens)


class DispatchQueue:
    """Requests admitted but not yet sent, in `priority_key` order. A plain list: the queue is
    short (the gate holds only what the workers cannot take yet) and each pop is O(n).
    `cost` may be replaced (e.g. by a new `OnlinePrefillFit` model) between calls."""

    def __init__(self, cost: CostModel, config: PlacementConfig):
        self.cost, self.config = cost, config
        self._items: list[QueuedItem] = []

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return any(item.request_id == request_id for item in self._items)

    def push(self, item: QueuedItem) -> None:
        if item.request_id in self:
            raise ValueError(f"request {item.request_id} is already queued")
        self._items.append(item)

    def ordered(self, now_s: float) -> list[QueuedItem]:
        """Every queued item, next first."""
        return sorted(self._items, key=lambda item: (priority_key(item, now_s, self.cost, self.config),
                                                     item.arrived_s, item.request_id))

    def peek(self, now_s: float) -> QueuedItem | None:
        ordered = self.ordered(now_s)
        return ordered[0] if ordered else None

    def pop_next(self, now_s: float) -> QueuedItem | None:
        """Removes and returns the item to dispatch next, or None when empty."""
        item = self.peek(now_s)
        if item is not None:
            self._items.remove(item)
        return item

    def remove(self, request_id: str) -> bool:
        """Drops a request (cancelled, timed out); False when it is not queued."""
        for index, item in enumerate(self._items):
            if item.request_id == request_id:
                del self._items[index]
                return True
        return False

    def tokens_ahead_of(self, request_id: str, now_s: float) -> int:
        """Prompt tokens of the queued requests that go before `request_id` (KeyError if not queued):
        add them to a worker's queued tokens to predict the request's wait including this queue."""
        ahead = 0
        for item in self.ordered(now_s):
            if item.request_id == request_id:
                return ahead
            ahead += item.num_prompt_tokens
        raise KeyError(request_id)
