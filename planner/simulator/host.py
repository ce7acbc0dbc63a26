"""The host's CPU: what the processes bound to no worker (the router, a client on the same host)
take from the engines' cores.

Their demand is work that arrives with the traffic: `host_cpu_s_per_request` per request (and
`host_cpu_s_per_prompt_token` per token of its prompt), a third
at each of the moments the router works on it (admission at arrival, the Decode call at the
handoff, the end of its stream), and `host_cpu_s_per_token` per token the engines emit (and
`host_cpu_s_per_step` per step that emits any: the wake-up its outputs cost). Over the
last `window_s` that is a load of x cores. Where the router is bound to the prefill workers' cores
(`router_cores` > 0: `pdserve up`'s default for a cluster with a prefill pool apart from its decode
workers), its own part (`router_cpu_s_per_*`) runs only there and shares any step there: it is
served as it comes, not deferred to idle time. The rest (the client) takes cores apart from the
router's that no engine is stepping on first, then the room the router leaves on its cores
(Linux runs a woken thread on the less loaded core: the one not decoding), sharing a step there;
what is left shares the other stepping cores. Where the router floats, all of it is the rest,
which takes idle cores first and then shares every stepping core. A step's stretch is the
processor-sharing slowdown 1 / (1 - the share of its core taken), capped at 1 / (1 - MAX_STOLEN);
for an engine whose threads span several cores, the share of its time taken is the load on all of
them, since they wait for each other after every layer (BENCHMARKS, "vLLM's server replayed with
its front end's CPU": a two-core engine beside a load on one core slowed as a one-core engine does).
The hops of a first token (`ServingCosts.first_token_s`, `handoff_s`) run on the router's cores
and take a step's stretch there (`planner.simulator.engine`). With `host_cores` 0 nothing is
modelled and every stretch is 1.

Against the cross-shape validations (BENCHMARKS, "Where the prefill core's time goes"), on an
AVX-512 EPYC over shm the TTFT p50 errors of the four shapes are 14/1/2/8% with this model and
were 23/1/30/18% with the client spread over every stepping core, the router's per-request work at
arrival and the hops unstretched; on the AVX2-only run over tcp, 19/17/23/17% against 12/18/26/15%.
"""

from __future__ import annotations

from collections import deque

from planner.serving_costs import CLIENT_PLACEMENTS, ServingCosts  # noqa: F401  (re-exported)

MAX_STOLEN = 0.9  # the share of a busy core the host's load may take (keeps the model finite)
# `SimSettings.hops` "loaded": the share of a hop's time lost to the load on its prefill core, per
# core of the unbound processes' demand there and per share of the time the prefill engine steps.
# Fitted on 684 kept runs of four host kinds, the runs' mean loads against their measured hop in
# over the simulator's: 0.65 and 0.40 (each kind left out in turn: 0.53-0.75 and 0.39-0.43); the
# simulator reads the loads over its 0.5 s window, which swing with the bursts, and with those
# weights put six validations' hop in at +31% (signed), so both are scaled by 0.7: -7%
# (BENCHMARKS, "The hop in under load")
HOP_LOSS_PER_UNBOUND_CORE = 0.45
HOP_LOSS_PER_PREFILL_BUSY = 0.28
REQUEST_MOMENTS = 3  # arrival, handoff, end: a request's CPU in the router and the client is spread over them
ROUTER_CHARGES = ("window", "backlog")  # where a bound router's per-request CPU goes (`HostCpu`)


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

    def __init__(self, costs: ServingCosts, window_s: float = 0.5, router_cores: float = 0.0,
                 router_charge: str = "window", router_core_max_stolen: float = MAX_STOLEN,
                 client_placement: str = "router-room") -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if router_cores < 0:
            raise ValueError(f"router_cores must be >= 0, got {router_cores}")
        if router_charge not in ROUTER_CHARGES:
            raise ValueError(f"router_charge must be one of {ROUTER_CHARGES}, got {router_charge!r}")
        if not 0 < router_core_max_stolen <= MAX_STOLEN:
            raise ValueError(f"router_core_max_stolen must be in (0, {MAX_STOLEN}], got {router_core_max_stolen}")
        if client_placement not in CLIENT_PLACEMENTS:
            raise ValueError(f"client_placement must be one of {CLIENT_PLACEMENTS}, got {client_placement!r}")
        self.costs, self.window_s = costs, window_s
        self.client_placement = client_placement
        self.router_core_max_stolen = router_core_max_stolen
        measured_apart = (costs.router_cpu_s_per_token or costs.router_cpu_s_per_request
                          or costs.router_cpu_s_per_prompt_token or costs.router_cpu_s_per_step)
        self.router_cores = router_cores if measured_apart else 0.0
        self._router, self._rest = _Window(window_s), _Window(window_s)
        # "backlog": the bound router's per-request CPU queues on its cores (`RouterBacklog`), charged
        # to the steps there instead of stretching them through the window; its per-token CPU, a
        # steady load while streams decode, stays in the window
        self.backlog = RouterBacklog(self.router_cores) if router_charge == "backlog" and self.router_cores > 0 else None

    @property
    def modelled(self) -> bool:
        return self.costs.host_cores > 0

    def request_moved(self, at_s: float, prompt_tokens: int) -> None:
        """One of the `REQUEST_MOMENTS` the router works on a request of `prompt_tokens`: its
        arrival, its handoff (or its first token, computed where it decodes), its end."""
        self._add(at_s, self.costs.host_request_cpu_s(prompt_tokens) / REQUEST_MOMENTS,
                  self.costs.router_request_cpu_s(prompt_tokens) / REQUEST_MOMENTS, queued=True)

    def tokens_emitted(self, at_s: float, num_tokens: int) -> None:
        """A decode step streamed `num_tokens` (one per sequence): each costs the router and the client
        their per-token CPU, and the step's outputs wake them once (their per-step CPU)."""
        if num_tokens <= 0:
            return
        c = self.costs
        self._add(at_s, c.host_cpu_s_per_token * num_tokens + c.host_cpu_s_per_step,
                  c.router_cpu_s_per_token * num_tokens + c.router_cpu_s_per_step)

    def load_cores(self, now: float) -> float:
        """The unbound processes' demand over the last window, in cores (the router's included)."""
        return self._router.load_cores(now) + self._rest.load_cores(now)

    def stretch(self, now: float, busy_cores: float, busy_router_cores: float = 0.0,
                on_router_cores: bool = False, team_cores: float = 1.0) -> float:
        """How much longer than its engine time a step starting now takes, when engines are
        stepping on `busy_cores` of the host's cores (the starting one included), `busy_router_cores`
        of them the router's; `on_router_cores`: the starting step is on one of those; `team_cores`,
        the cores the starting step's engine spans (`stretch_for_loads`)."""
        if not self.modelled:
            return 1.0
        return stretch_for_loads(self._rest.load_cores(now), self._router.load_cores(now), self.costs.host_cores,
                                 busy_cores, self.router_cores, busy_router_cores, on_router_cores, team_cores,
                                 self.router_core_max_stolen, self.client_placement)

    def router_delay_s(self, now: float, engine_s: float) -> float:
        """How much longer a step (or a hop) of `engine_s` starting now on the router's cores takes
        for the router's queued CPU (0 without a backlog)."""
        return self.backlog.serve(now, engine_s) if self.backlog is not None else 0.0

    def _add(self, at_s: float, host_cpu_s: float, router_cpu_s: float, queued: bool = False) -> None:
        """`queued`: the router's part is a request's (it comes in bursts: the backlog's, where there
        is one), not a stream's tokens (a steady load while decode runs: the window's)."""
        if not self.modelled:
            return
        if self.router_cores > 0:
            if queued and self.backlog is not None:
                self.backlog.add(at_s, router_cpu_s)
            else:
                self._router.add(at_s, router_cpu_s)
            self._rest.add(at_s, host_cpu_s - router_cpu_s)
        else:
            self._rest.add(at_s, host_cpu_s)


class RouterBacklog:
    """The bound router's CPU as work queued on its `cores`, served as it comes: a step (or a hop)
    of engine time d that starts with a backlog B shares the core with it and takes min(B, d)
    longer, which the backlog loses; a core with no step drains it at full speed. Under a steady
    load x of a core that never idles this is the window's stretch 1 / (1 - x); where the core
    idles between steps the router's work runs there for free; under a burst it charges the
    burst's work exactly, to the steps it lands on (BENCHMARKS, "How long a burst's CPU loads the
    router's core"). Work that arrives while a step runs is charged to the next one. A what-if
    (`SimSettings.router_cpu_charge`): resimulated, it moved the four kept validations' bursty
    goodput further from the measured than the window does (same section)."""

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self.backlog_s = 0.0   # CPU seconds queued
        self._free_at_s = 0.0  # until when the steps that charged the backlog hold the cores

    def add(self, at_s: float, cpu_s: float) -> None:
        self._drain(at_s)
        self.backlog_s += max(0.0, cpu_s)

    def serve(self, now: float, engine_s: float) -> float:
        self._drain(now)
        delay_s = min(self.backlog_s, max(0.0, engine_s))
        self.backlog_s -= delay_s
        self._free_at_s = max(self._free_at_s, now + engine_s + delay_s)
        return delay_s

    def _drain(self, now: float) -> None:
        idle_s = now - self._free_at_s
        if idle_s > 0:
            self.backlog_s = max(0.0, self.backlog_s - idle_s * self.cores)
            self._free_at_s = now


def stretch_for_loads(rest_cores: float, router_load_cores: float, host_cores: float, busy_cores: float,
                      router_cores: float = 0.0, busy_router_cores: float = 0.0, on_router_cores: bool = False,
                      team_cores: float = 1.0, router_core_max_stolen: float = MAX_STOLEN,
                      client_placement: str = "router-room") -> float:
    """The processor-sharing stretch of a step starting on one of `busy_cores` stepping cores
    (`on_router_cores`: on one of the router's, of which `busy_router_cores` step).

    The step's engine spans `team_cores` cores: its threads meet at a barrier after every layer, so
    work that takes any one of its cores holds all of them, and the share of its time it loses is
    the load on the cores it spans (the load a core times `team_cores`), not a core's share: an
    engine over two cores loses as much to a load of 0.1 cores as a one-core engine to 0.1.

    The router's `router_load_cores` share its `router_cores`. The rest (`rest_cores`) takes the
    idle cores apart from the router's, then the room the router leaves on its own, then shares the
    other stepping cores (all of it on the router's where no other core steps). With `router_cores`
    0 the router's load is part of the rest, which takes idle cores first and shares every stepping
    core.

    A step on the router's cores loses at most `router_core_max_stolen` of its time there (every
    other step at most `MAX_STOLEN`): 0.5 says Linux's fair scheduler keeps a stepping engine at
    least half its core against the router (`SimSettings.router_core_max_stolen`, a what-if).

    `client_placement` (`SimSettings.client_placement`) says where the rest left goes while other
    cores step: "router-room", the room the router leaves on its cores first; "balanced", the same
    except while every one of the router's cores also steps an engine, when it shares every
    stepping core alike, as a scheduler balancing its run queues would spread it; "wake", as Linux
    places a woken thread (`wake_share_on_router`)."""
    if busy_cores <= 0 or host_cores <= 0:
        return 1.0
    team = max(1.0, team_cores)
    if router_cores <= 0:
        spill = max(0.0, rest_cores + router_load_cores - max(0.0, host_cores - busy_cores))
        return _stretch(spill / busy_cores * team)
    busy_elsewhere = max(0.0, busy_cores - busy_router_cores)
    rest_left = max(0.0, rest_cores - max(0.0, host_cores - router_cores - busy_elsewhere))
    if client_placement == "wake" and busy_elsewhere > 0:
        on_router = wake_share_on_router(rest_left, router_load_cores, busy_router_cores, router_cores)
    elif client_placement == "balanced" and busy_elsewhere > 0 and busy_router_cores >= router_cores:
        on_router = rest_left * router_cores / (router_cores + busy_elsewhere)
    else:
        on_router = rest_left if busy_elsewhere <= 0 else min(rest_left, max(0.0, router_cores - router_load_cores))
    if on_router_cores:
        return _stretch((router_load_cores + on_router) / router_cores * min(team, router_cores), router_core_max_stolen)
    return _stretch((rest_left - on_router) / busy_elsewhere * min(team, busy_elsewhere)) if busy_elsewhere > 0 else 1.0


def wake_share_on_router(rest_cores: float, router_load_cores: float, busy_router_cores: float,
                         router_cores: float) -> float:
    """The part of the client's load `rest_cores` (what the idle cores did not take) that runs on
    the router's `router_cores` while every other core steps an engine, placed as Linux places a
    woken thread: on an idle core where there is one (here only the router's can be), and otherwise
    beside its waker or where it last ran, either alike. With u the router's cores' utilization, the
    client's own part there included, a share 1 - u / 2 of it lands there:
    x = C (1 - min(1, (L + b + x) / R) / 2), for the router's load L and the `busy_router_cores` b
    stepping there; once those cores are full (u = 1) half of it.

    Measured on an AMX Xeon (BENCHMARKS, "Where the client runs"): the tiny model's short-long
    shape at 3.75-15 req/s put 0.01, 0.03, 0.16 and 0.20 cores of it on the stepping decode core
    where this gives 0.02, 0.05, 0.16 and 0.18 (with the measured router and
    client loads), and left the router's core 20% idle at the highest rate, where the "router-room"
    placement fills it first and puts none on the decode core."""
    if rest_cores <= 0 or router_cores <= 0:
        return 0.0
    base = (router_load_cores + busy_router_cores) / router_cores
    if base >= 1:
        return rest_cores / 2
    share = rest_cores * (1 - base / 2) / (1 + rest_cores / (2 * router_cores))
    return share if base + share / router_cores <= 1 else rest_cores / 2


def _stretch(stolen: float, most: float = MAX_STOLEN) -> float:
    return 1.0 / (1.0 - min(most, stolen))


def loaded_hop_stretch(unbound_cores_per_core: float, prefill_busy_share: float, most: float = MAX_STOLEN) -> float:
    """How much longer a prefilled request's hops take (on top of `HostCpu.stretch`'s stretch of a
    step on its prefill core) where the unbound processes (the router, the client) demand
    `unbound_cores_per_core` of each of the router's cores and its prefill engine stepped
    `prefill_busy_share` of the recent window: 1 / (1 - the share of the hop's time they take),
    that share `HOP_LOSS_PER_UNBOUND_CORE` x the first plus `HOP_LOSS_PER_PREFILL_BUSY` x the
    second, at most `most`. The hop runs through the prefill worker's API process and the router's
    event loop, each one thread queued behind the streams' tokens and the other requests' work on a
    core the engine steps on: a processor-sharing stretch of the load's measured size, not a
    queue modelled process by process. Pure."""
    if unbound_cores_per_core < 0 or not 0 <= prefill_busy_share <= 1:
        raise ValueError(f"loads must be >= 0 and a busy share in [0, 1], got {unbound_cores_per_core}, "
                         f"{prefill_busy_share}")
    return _stretch(HOP_LOSS_PER_UNBOUND_CORE * unbound_cores_per_core + HOP_LOSS_PER_PREFILL_BUSY * prefill_busy_share,
                    most)


def decode_call_wait_s(step_tokens: int, cpu_s_per_token: float, engine_stepping: bool) -> float:
    """How long a Decode call waits in its decode worker's API process behind the outputs of the
    step the engine last emitted, while the engine steps: that process takes a step's
    `step_tokens` outputs in one go (vLLM's output handler, then each stream's message:
    `cpu_s_per_token` each, the profile's `decode_cpu_s_per_token`) before its event loop reads
    the call, at half the core it shares with the stepping engine core (processor sharing with one
    busy thread). An idle engine's last outputs were handled as it went idle: no wait."""
    return step_tokens * cpu_s_per_token * 2.0 if engine_stepping else 0.0


def router_outputs_wait_s(stepping_tokens: int, cpu_s_per_token: float) -> float:
    """How long a message through the router (a first token, a Decode call) waits behind the
    streams' tokens of the decode side's running steps: the router relays each (`cpu_s_per_token`,
    the profile's `router_cpu_s_per_token`) as its step's outputs come, in the same event loop."""
    return stepping_tokens * cpu_s_per_token


def stretch_for_load(load_cores: float, host_cores: float, busy_cores: float) -> float:
    """The stretch when all of the unbound load floats (`stretch_for_loads` with no bound router):
    it takes idle cores first, then shares the `busy_cores` stepping ones."""
    return stretch_for_loads(load_cores, 0.0, host_cores, busy_cores)
