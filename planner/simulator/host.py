"""The host's CPU: what the processes bound to no worker (the router, a client on the same host)
take from the engines' cores.

Their demand is work that arrives with the traffic: `host_cpu_s_per_request` per arriving
request, `host_cpu_s_per_token` per token the engines emit. Over the last `window_s` that is a
load of x cores. The scheduler runs it on cores no engine is stepping on first; what is left, x',
shares the cores of the engines that are stepping, so a step starting now is stretched by
1 / (1 - x'/busy_cores), the processor-sharing slowdown (capped at 1/(1 - MAX_STOLEN)). With
`host_cores` 0 nothing is modelled and every stretch is 1.
"""

from __future__ import annotations

from collections import deque

from planner.profile import ServingCosts

MAX_STOLEN = 0.9  # the share of a busy core the host's load may take (keeps the model finite)


class HostCpu:
    def __init__(self, costs: ServingCosts, window_s: float = 0.5) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.costs, self.window_s = costs, window_s
        self._work: deque[tuple[float, float]] = deque()  # (at_s, cpu_s), oldest first
        self._window_cpu_s = 0.0

    @property
    def modelled(self) -> bool:
        return self.costs.host_cores > 0

    def request_arrived(self, at_s: float) -> None:
        self._add(at_s, self.costs.host_cpu_s_per_request)

    def tokens_emitted(self, at_s: float, num_tokens: int) -> None:
        self._add(at_s, self.costs.host_cpu_s_per_token * num_tokens)

    def load_cores(self, now: float) -> float:
        """The unbound processes' demand over the last window, in cores."""
        while self._work and self._work[0][0] < now - self.window_s:
            self._window_cpu_s -= self._work.popleft()[1]
        return max(0.0, self._window_cpu_s) / self.window_s

    def stretch(self, now: float, busy_cores: float) -> float:
        """How much longer than its engine time a step starting now takes, when engines are
        stepping on `busy_cores` of the host's cores (the starting one included)."""
        if not self.modelled:
            return 1.0
        return stretch_for_load(self.load_cores(now), self.costs.host_cores, busy_cores)

    def _add(self, at_s: float, cpu_s: float) -> None:
        if self.modelled and cpu_s > 0:
            self._work.append((at_s, cpu_s))
            self._window_cpu_s += cpu_s


def stretch_for_load(load_cores: float, host_cores: float, busy_cores: float) -> float:
    """The processor-sharing stretch of a step on one of `busy_cores` stepping engines when the
    unbound processes want `load_cores` of a host with `host_cores`: they take idle cores first."""
    if busy_cores <= 0 or host_cores <= 0:
        return 1.0
    spill = max(0.0, load_cores - max(0.0, host_cores - busy_cores))
    return 1.0 / (1.0 - min(MAX_STOLEN, spill / busy_cores))
