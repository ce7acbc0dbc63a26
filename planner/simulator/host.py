"""The host's CPU: what the processes bound to no worker (the router, a client on the same host)
take from the engines' cores.

Their demand is work that arrives with the traffic: `host_cpu_s_per_request` per arriving
request, `host_cpu_s_per_token` per token the engines emit. Over the last `window_s` that is a
load of x cores. Where the router is bound to the prefill workers' cores (`router_cores` > 0:
`pdserve up`'s default for a cluster with a prefill pool apart from its decode workers), its own
part (`router_cpu_s_per_*`) runs only there: on those cores while no prefill step runs, else it
shares the prefill steps' cores. The rest (the client), and all of it where the router floats, runs
on cores no engine is stepping on first (the router's cores it leaves idle included); what is left
shares the cores of every engine that is stepping. A step's stretch is the processor-sharing
slowdown 1 / (1 - the share of its core taken), capped at 1 / (1 - MAX_STOLEN). With `host_cores`
0 nothing is modelled and every stretch is 1.
"""

from __future__ import annotations

from collections import deque

from planner.profile import ServingCosts

MAX_STOLEN = 0.9  # the share of a busy core the host's load may take (keeps the model finite)


class _Window:
    """CPU seconds of work that arrived over the last `window_s`, as a load in cores."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._work: deque[tuple[float, float]] = deque()  # (at_s, cpu_s), oldest first
        self._cpu_s = 0.0

    def add(self, at_s: float, cpu_s: float) -> None:
        if cpu_s > 0:
            self._work.append((at_s, cpu_s))
            self._cpu_s += cpu_s

    def load_cores(self, now: float) -> float:
        while self._work and self._work[0][0] < now - self.window_s:
            self._cpu_s -= self._work.popleft()[1]
        return max(0.0, self._cpu_s) / self.window_s


class HostCpu:
    """The unbound processes' load over time; `router_cores` is how many cores the router is
    bound to (the prefill instances' cores), 0 when it floats."""

    def __init__(self, costs: ServingCosts, window_s: float = 0.5, router_cores: float = 0.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if router_cores < 0:
            raise ValueError(f"router_cores must be >= 0, got {router_cores}")
        self.costs, self.window_s = costs, window_s
        self.router_cores = router_cores if costs.router_cpu_s_per_token or costs.router_cpu_s_per_request else 0.0
        self._router, self._rest = _Window(window_s), _Window(window_s)

    @property
    def modelled(self) -> bool:
        return self.costs.host_cores > 0

    def request_arrived(self, at_s: float) -> None:
        self._add(at_s, self.costs.host_cpu_s_per_request, self.costs.router_cpu_s_per_request)

    def tokens_emitted(self, at_s: float, num_tokens: int) -> None:
        self._add(at_s, self.costs.host_cpu_s_per_token * num_tokens, self.costs.router_cpu_s_per_token * num_tokens)

    def load_cores(self, now: float) -> float:
        """The unbound processes' demand over the last window, in cores (the router's included)."""
        return self._router.load_cores(now) + self._rest.load_cores(now)

    def stretch(self, now: float, busy_cores: float, busy_router_cores: float = 0.0,
                on_router_cores: bool = False) -> float:
        """How much longer than its engine time a step starting now takes, when engines are
        stepping on `busy_cores` of the host's cores (the starting one included), `busy_router_cores`
        of them the router's; `on_router_cores`: the starting step is on one of those."""
        if not self.modelled:
            return 1.0
        return stretch_for_loads(self._rest.load_cores(now), self._router.load_cores(now), self.costs.host_cores,
                                 busy_cores, self.router_cores, busy_router_cores, on_router_cores)

    def _add(self, at_s: float, host_cpu_s: float, router_cpu_s: float) -> None:
        if not self.modelled:
            return
        if self.router_cores > 0:
            self._router.add(at_s, router_cpu_s)
            self._rest.add(at_s, host_cpu_s - router_cpu_s)
        else:
            self._rest.add(at_s, host_cpu_s)


def stretch_for_loads(rest_cores: float, router_load_cores: float, host_cores: float, busy_cores: float,
                      router_cores: float = 0.0, busy_router_cores: float = 0.0, on_router_cores: bool = False) -> float:
    """The processor-sharing stretch of a step starting on one of `busy_cores` stepping cores.

    The router wants `router_load_cores` of the `router_cores` it is bound to (`busy_router_cores` of
    them stepping); what their idle part cannot hold shares their stepping cores only. The rest of
    the unbound load (`rest_cores`) takes any idle core first (the router's that it leaves idle
    included), and what is left shares every stepping core. With `router_cores` 0 the router's load
    is part of the rest."""
    if busy_cores <= 0 or host_cores <= 0:
        return 1.0
    if router_cores <= 0:
        rest_cores, router_load_cores, busy_router_cores = rest_cores + router_load_cores, 0.0, 0.0
    idle_router = max(0.0, router_cores - busy_router_cores)
    router_spill = max(0.0, router_load_cores - idle_router)
    idle_elsewhere = max(0.0, host_cores - router_cores - (busy_cores - busy_router_cores))
    rest_spill = max(0.0, rest_cores - idle_elsewhere - max(0.0, idle_router - router_load_cores))
    stolen = rest_spill / busy_cores
    if on_router_cores and busy_router_cores > 0:
        stolen += router_spill / busy_router_cores
    return 1.0 / (1.0 - min(MAX_STOLEN, stolen))


def stretch_for_load(load_cores: float, host_cores: float, busy_cores: float) -> float:
    """The stretch when all of the unbound load floats (`stretch_for_loads` with no bound router):
    it takes idle cores first, then shares the `busy_cores` stepping ones."""
    return stretch_for_loads(load_cores, 0.0, host_cores, busy_cores)
