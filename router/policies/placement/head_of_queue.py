"""Which prompt each worker is computing now, by a router's books. Pure: the caller passes the clock.

A worker computes the prompts sent to it in order (a prefill worker's, or a decode worker's Local
prompts). The first of those not yet back began when it was sent to an idle worker, or when the
one before it came back; the placement charges what is left of it, not the whole of it again
(`CostModel.queue_s`): charged whole, a prompt about to finish cost every request behind it its
full prefill once more, and admission refused long prompts that would have met their SLO.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class HeadOfQueue:
    def __init__(self) -> None:
        self._booked: dict[str, OrderedDict[Hashable, int]] = {}
        self._started_s: dict[str, float] = {}

    def book(self, worker_id: str, key: Hashable, tokens: int, now_s: float) -> None:
        """A prompt of `tokens` tokens, known as `key`, is sent to `worker_id` at `now_s`."""
        queue = self._booked.setdefault(worker_id, OrderedDict())
        if not queue:
            self._started_s[worker_id] = now_s   # an idle worker starts on it at once
        queue[key] = tokens

    def settle(self, worker_id: str, key: Hashable, now_s: float) -> None:
        """The prompt `key` is back (its first token), or will never run, at `now_s`: when it was the
        first, the next one begins now. Unknown keys are ignored."""
        queue = self._booked.get(worker_id)
        if not queue or key not in queue:
            return
        was_first = next(iter(queue)) == key
        del queue[key]
        if was_first and queue:
            self._started_s[worker_id] = now_s

    def head(self, worker_id: str, now_s: float) -> tuple[int, float]:
        """(tokens of the prompt the worker is computing, seconds since it began); (0, 0.0) when idle."""
        queue = self._booked.get(worker_id)
        if not queue:
            return 0, 0.0
        return next(iter(queue.values())), max(0.0, now_s - self._started_s[worker_id])

    def view_fields(self, worker_id: str, now_s: float) -> dict[str, float]:
        """`head_tokens` and `head_elapsed_s` of the worker's `WorkerView`."""
        tokens, elapsed_s = self.head(worker_id, now_s)
        return {"head_tokens": tokens, "head_elapsed_s": elapsed_s}
