"""CPU work on an engine's core beside its steps: a prefilled request's hops (`SimSettings.hops`
"prefill-core"), which run in the prefill worker's API process and the router, both on the
prefill engine's core.

Each piece of work runs at the whole core while the engine idles and at `share` of it while the
engine steps (0.5: processor sharing with the engine's one busy thread; 0: it waits for the
engine's gaps), each on its own, as `planner.validation_joins.served_by_s` reads it from a trace.
The engine's steps are known only as they start, so the work is advanced at each change of the
engine's state and asked, after it, for the next piece that completes before the next change.
Pure state: the cluster's event loop drives it (`planner.simulator.engine`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

# a hop's share of the prefill engine's core while the engine steps: processor sharing with its one
# busy thread (BENCHMARKS, "The hops beside the prefill engine's steps": the traced ways in that
# found the prefill engine stepping took about twice the lone hop at the median)
HOP_SHARE_WHILE_STEPPING = 0.5


class WorkBesideSteps:
    """The pieces of work pending on one engine's core, keyed by the caller's objects."""

    def __init__(self, share_while_stepping: float) -> None:
        if not 0 <= share_while_stepping <= 1:
            raise ValueError(f"share_while_stepping must be in [0, 1], got {share_while_stepping}")
        self.share = share_while_stepping
        self._left_s: dict[int, tuple[Any, float, float]] = {}  # id -> (key, CPU seconds left, added at)
        self._since_s = 0.0
        self._stepping_until_s: float | None = None
        self.version = 0  # moves at every change: a completion scheduled before it is stale

    def __len__(self) -> int:
        return len(self._left_s)

    def add(self, now: float, key: Any, cpu_s: float) -> None:
        self._advance(now)
        self._left_s[id(key)] = (key, max(0.0, cpu_s), now)
        self.version += 1

    def step_started(self, now: float, end_s: float) -> None:
        self._advance(now)
        self._stepping_until_s = end_s
        self.version += 1

    def step_ended(self, now: float) -> None:
        self._advance(now)
        self._stepping_until_s = None
        self.version += 1

    def next_done_s(self, now: float) -> float | None:
        """When the first pending piece completes if the engine's state holds until its next known
        change (the running step's end); None when nothing completes before it, or nothing is pending."""
        self._advance(now)
        if not self._left_s:
            return None
        least_s = min(left_s for _, left_s, _ in self._left_s.values())
        if self._stepping_until_s is None:
            return now + least_s
        if self.share > 0 and least_s <= (self._stepping_until_s - now) * self.share:
            return now + least_s / self.share
        return None

    def done(self, now: float) -> list[tuple[Any, float]]:
        """Removes and returns the pieces complete at `now`, each with when it was added."""
        self._advance(now)
        finished = [(key, added_s) for key, left_s, added_s in self._left_s.values() if left_s <= 1e-12]
        for key, _ in finished:
            del self._left_s[id(key)]
        if finished:
            self.version += 1
        return finished

    def _advance(self, now: float) -> None:
        elapsed_s = now - self._since_s
        if elapsed_s > 0 and self._left_s:
            rate = 1.0 if self._stepping_until_s is None else self.share
            self._left_s = {k: (key, max(0.0, left_s - elapsed_s * rate), added_s)
                            for k, (key, left_s, added_s) in self._left_s.items()}
        self._since_s = max(self._since_s, now)


class BusyWindow:
    """An engine's steps over the last `window_s`: the share of that window it spent stepping
    (`SimSettings.hops` "loaded" reads it for its prefill instance). Pure state."""

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._steps: deque[tuple[float, float]] = deque()  # (start, end) in start order

    def step(self, start_s: float, end_s: float) -> None:
        """A step from `start_s` to `end_s` (its end may be ahead of the clock)."""
        if end_s < start_s:
            raise ValueError(f"a step cannot end ({end_s}) before it starts ({start_s})")
        self._steps.append((start_s, end_s))

    def busy_share(self, now: float) -> float:
        """The share of (now - window_s, now] covered by steps, in [0, 1]."""
        since = now - self.window_s
        while self._steps and self._steps[0][1] <= since:
            self._steps.popleft()
        busy_s = sum(max(0.0, min(end, now) - max(start, since)) for start, end in self._steps)
        return min(1.0, busy_s / self.window_s)
