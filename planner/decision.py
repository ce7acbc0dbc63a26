"""The online SLA planner's decision core: one interval's observations in, target pool sizes out.

Pure: no clock, no I/O. The loop around it reads the load, calls `decide`, and hands the target
to an actuator. The steps, each named in `Decision.reasons` when it changes something:

1. predict the next interval's arrival rate from the recent ones (`predictor`);
1b. correct the model by what it gets wrong: with a `predict` function, the correction of each
   SLO is observed p90 / the model's p90 for the replicas that were serving (`ready`) at the
   observed load, clamped to [min_correction, max_correction]; the plan must then meet the SLO
   divided by it (Dynamo's SLA planner does the same). A model that misses a cost the cluster
   pays (RPC and streaming overhead, a noisy neighbour) is thereby scaled to what is observed, so
   the plan agrees with the observations instead of undoing the guard below after each cooldown.
   A caller that tracks the model's error across intervals (`planner.model_error`) passes its
   smoothed correction as `scale` instead, and this one-interval ratio is not computed;
2. ask `plan(rate, mean_prompt, mean_output, slo_scale)` (the search over the simulator) for the
   fewest pool sizes meeting the SLOs; grow a pool to the plan at the predicted rate, shrink it only to
   the plan at the predicted rate plus `scale_down_headroom` (hysteresis: no flapping at a
   boundary);
3. reactive guard: a pool whose observed p90 breaks its SLO grows by one and never shrinks,
   whatever the model says (the model can be wrong; observations win), once the window holds
   `min_requests_for_guard` finished requests (the p90 of three requests is their slowest: one
   slow request at a trickle is not an SLO breach);
3b. a pool with replicas still starting (`ready` below `current`) holds its size: what was
   observed predates them, so growing again would add replicas for load they will absorb, and
   shrinking would judge the new size by latencies measured without it;
4. move at most `max_step_up` / `max_step_down` replicas per pool per decision;
5. cooldown: no growth within `scale_up_cooldown_s` and no shrink within
   `scale_down_cooldown_s` of the last scaling action (the loop restarts this clock when the
   replicas a scale-up asked for start serving: a change is judged by its effect);
6. clamp to the per-pool bounds (always applied, cooldown or not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pdserve.roles import Topology as TopologyKind
from planner.pool_sizes import ROLES, PoolSizes, Role
from planner.topology_switch import bounds_for, check_kinds

@dataclass(frozen=True)
class SloScale:
    """What the plan must meet, as multiples of the SLOs (1 / the model's correction)."""

    ttft: float = 1.0
    tpot: float = 1.0


# plan(rate_rps, mean_prompt_tokens, mean_output_tokens, slo_scale) -> fewest sizes, or None
PlanFn = Callable[[float, float, float, SloScale], PoolSizes | None]
# predict(sizes, rate_rps, mean_prompt_tokens, mean_output_tokens) -> the model's (TTFT p90, TPOT p90) s
PredictFn = Callable[[PoolSizes, float, float, float], tuple[float | None, float | None]]
Predictor = Literal["last", "moving_average", "trend"]


@dataclass(frozen=True)
class ObservedLoad:
    """One interval as measured. p90s are None when the pool served nothing in the interval."""

    arrival_rate_rps: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft_p90_s: float | None
    tpot_p90_s: float | None
    current: PoolSizes
    seconds_since_last_scale: float
    rate_history_rps: tuple[float, ...] = ()  # earlier intervals, oldest first
    ready: PoolSizes | None = None  # replicas serving now (None: unknown, taken as all of `current`)
    num_finished: int | None = None  # requests behind the p90s (None: unknown, taken as enough)

    def __post_init__(self) -> None:
        if self.arrival_rate_rps < 0 or any(r < 0 for r in self.rate_history_rps):
            raise ValueError("arrival rates must be >= 0 requests/s")
        if self.seconds_since_last_scale < 0:
            raise ValueError(f"seconds_since_last_scale must be >= 0, got {self.seconds_since_last_scale}")


@dataclass(frozen=True)
class PlannerConfig:
    ttft_slo_s: float
    tpot_slo_s: float
    min_sizes: PoolSizes = PoolSizes(prefill=1, decode=1)
    max_sizes: PoolSizes = PoolSizes(prefill=8, decode=8)
    scale_up_cooldown_s: float = 30.0
    scale_down_cooldown_s: float = 120.0
    max_step_up: int = 2
    max_step_down: int = 1
    scale_down_headroom: float = 0.2
    predictor: Predictor = "trend"
    window: int = 3  # intervals the predictor looks at (including the current one)
    min_correction: float = 0.5  # bounds on observed / modelled latency (step 1b)
    max_correction: float = 10.0
    min_requests_for_guard: int = 10  # finished requests in the window before the guard trusts a p90
    topologies: tuple[TopologyKind, ...] = ("disaggregated",)  # kinds the planner may run, preferred first
    topology_cooldown_s: float = 300.0  # no topology switch within this long of the last one

    def __post_init__(self) -> None:
        if not (self.ttft_slo_s > 0 and self.tpot_slo_s > 0):
            raise ValueError(f"SLOs must be > 0 seconds, got ttft {self.ttft_slo_s}, tpot {self.tpot_slo_s}")
        for role in ROLES:
            if self.min_sizes.of(role) > self.max_sizes.of(role):
                raise ValueError(f"min_sizes.{role}={self.min_sizes.of(role)} exceeds "
                                 f"max_sizes.{role}={self.max_sizes.of(role)}; lower the min or raise the max")
        if self.scale_up_cooldown_s < 0 or self.scale_down_cooldown_s < 0:
            raise ValueError("cooldowns must be >= 0 seconds")
        if self.max_step_up < 1 or self.max_step_down < 1:
            raise ValueError("max_step_up and max_step_down must be >= 1 replica, or the planner can never move")
        if self.scale_down_headroom < 0:
            raise ValueError(f"scale_down_headroom must be >= 0 (0.2 = shrink only with 20% to spare), "
                             f"got {self.scale_down_headroom}")
        if not 0 < self.min_correction <= 1 <= self.max_correction:
            raise ValueError(f"need 0 < min_correction <= 1 <= max_correction, got {self.min_correction}, "
                             f"{self.max_correction}")
        if self.min_requests_for_guard < 1:
            raise ValueError(f"min_requests_for_guard must be >= 1 request, got {self.min_requests_for_guard}")
        check_kinds(self.topologies)
        if self.topology_cooldown_s < 0:
            raise ValueError(f"topology_cooldown_s must be >= 0 seconds, got {self.topology_cooldown_s}")
        if self.predictor not in ("last", "moving_average", "trend") or self.window < 1:
            raise ValueError(f"predictor must be last|moving_average|trend and window >= 1, got "
                             f"{self.predictor!r}, {self.window}")


@dataclass(frozen=True)
class Decision:
    current: PoolSizes
    target: PoolSizes
    predicted_rate_rps: float
    reasons: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return self.target != self.current


def predict_rate(rates_rps: tuple[float, ...], predictor: Predictor, window: int) -> float:
    """Next interval's rate from the recent ones (oldest first, the current one last)."""
    recent = rates_rps[-window:]
    if predictor == "last" or len(recent) == 1:
        return recent[-1]
    if predictor == "moving_average":
        return sum(recent) / len(recent)
    n = len(recent)  # least-squares slope per interval, extrapolated one interval ahead
    x_mean, y_mean = (n - 1) / 2, sum(recent) / n
    slope = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(recent)) / sum((i - x_mean) ** 2 for i in range(n))
    return max(0.0, y_mean + slope * (n - x_mean))


def decide(state: ObservedLoad, config: PlannerConfig, plan: PlanFn, predict: PredictFn | None = None,
           scale: SloScale | None = None, kind: TopologyKind = "disaggregated") -> Decision:
    """The target pool sizes for the next interval. See the module docstring for the rules.
    `scale`, when given, is the model's correction tracked by the caller (step 1b); `predict` is then unused.
    `kind`: the topology the pools are sized for (`plan` plans that kind); an aggregated cluster
    has no prefill pool, and its TTFT guard grows the workers that compute prompts, the decode pool."""
    rate = predict_rate(state.rate_history_rps + (state.arrival_rate_rps,), config.predictor, config.window)
    reasons: list[str] = [f"predicted {rate:.3g} req/s ({config.predictor})"]
    if scale is not None:
        if scale != SloScale():
            reasons.append(f"model correction (tracked): TTFT x{1 / scale.ttft:.2f}, TPOT x{1 / scale.tpot:.2f}")
    else:
        scale = correction(state, config, predict, reasons) if predict is not None else SloScale()
    lows, highs = bounds_for(kind, config.min_sizes, config.max_sizes)
    wanted = _planned(state, config, plan, rate, scale, reasons, lows, highs)
    wanted = _reactive(state, config, wanted, reasons, prompt_role="decode" if kind == "aggregated" else "prefill")
    wanted = _wait_for_starting(state, wanted, reasons)
    sizes = {}
    for role in ROLES:
        current, value = state.current.of(role), wanted[role]
        value = max(current - config.max_step_down, min(current + config.max_step_up, value))
        value = _cooldown(role, current, value, state.seconds_since_last_scale, config, reasons)
        low, high = lows.of(role), highs.of(role)
        if not low <= value <= high:
            reasons.append(f"{role}: {value} clamped to bounds [{low}, {high}]")
            value = max(low, min(high, value))
        sizes[role] = value
    return Decision(state.current, PoolSizes(**sizes), rate, tuple(reasons))


def correction(state: ObservedLoad, config: PlannerConfig, predict: PredictFn, reasons: list[str]) -> SloScale:
    """Step 1b: SLO multipliers from observed / modelled p90s; 1 where either is unknown."""
    serving = state.ready if state.ready is not None else state.current
    if serving.prefill < 1 or serving.decode < 1 or state.arrival_rate_rps <= 0:
        return SloScale()
    modelled = predict(serving, state.arrival_rate_rps, state.mean_prompt_tokens, state.mean_output_tokens)
    factors = []
    for observed, model in zip((state.ttft_p90_s, state.tpot_p90_s), modelled):
        if observed is None or model is None or model <= 0:
            factors.append(1.0)
            continue
        factors.append(min(config.max_correction, max(config.min_correction, observed / model)))
    if factors != [1.0, 1.0]:
        reasons.append(f"model correction at {serving}: TTFT x{factors[0]:.2f}, TPOT x{factors[1]:.2f} "
                       "(observed p90 / modelled)")
    return SloScale(ttft=1 / factors[0], tpot=1 / factors[1])


def _planned(state: ObservedLoad, config: PlannerConfig, plan: PlanFn, rate: float, scale: SloScale,
             reasons: list[str], lows: PoolSizes, highs: PoolSizes) -> dict[Role, int]:
    if rate <= 0:
        reasons.append("no traffic predicted: minimum sizes")
        return lows.as_dict()
    up = plan(rate, state.mean_prompt_tokens, state.mean_output_tokens, scale)
    if up is None:
        reasons.append("no pool sizes in the search meet the SLOs at this load: maximum sizes")
        return highs.as_dict()
    down = plan(rate * (1 + config.scale_down_headroom), state.mean_prompt_tokens, state.mean_output_tokens, scale)
    wanted: dict[Role, int] = {}
    for role in ROLES:
        current = state.current.of(role)
        if up.of(role) > current:
            wanted[role] = up.of(role)
            reasons.append(f"{role}: plan needs {up.of(role)} > {current}")
        elif down is not None and down.of(role) < current:
            wanted[role] = down.of(role)
            reasons.append(f"{role}: plan fits {down.of(role)} < {current} with "
                           f"{config.scale_down_headroom:.0%} headroom")
        else:
            wanted[role] = current
    return wanted


def _reactive(state: ObservedLoad, config: PlannerConfig, wanted: dict[Role, int],
              reasons: list[str], prompt_role: Role = "prefill") -> dict[Role, int]:
    checks: tuple[tuple[Role, float | None, float, str], ...] = (
        (prompt_role, state.ttft_p90_s, config.ttft_slo_s, "TTFT"),
        ("decode", state.tpot_p90_s, config.tpot_slo_s, "TPOT"))
    out = dict(wanted)
    for role, observed, slo, name in checks:
        current = state.current.of(role)
        if observed is not None and observed > slo and out[role] <= current:
            if state.num_finished is not None and state.num_finished < config.min_requests_for_guard:
                reasons.append(f"{role}: observed p90 {name} {observed:.3g}s > SLO {slo:.3g}s over only "
                               f"{state.num_finished} request(s) (< {config.min_requests_for_guard}): not acted on")
                continue
            out[role] = current + 1
            reasons.append(f"{role}: observed p90 {name} {observed:.3g}s > SLO {slo:.3g}s: +1")
    return out


def _wait_for_starting(state: ObservedLoad, wanted: dict[Role, int], reasons: list[str]) -> dict[Role, int]:
    if state.ready is None:
        return wanted
    out = dict(wanted)
    for role in ROLES:
        current, starting = state.current.of(role), state.current.of(role) - state.ready.of(role)
        if starting > 0 and out[role] != current:
            out[role] = current
            reasons.append(f"{role}: hold at {current}, {starting} replica(s) still starting")
    return out


def _cooldown(role: Role, current: int, value: int, since_s: float, config: PlannerConfig,
              reasons: list[str]) -> int:
    if value > current and since_s < config.scale_up_cooldown_s:
        reasons.append(f"{role}: hold at {current}, scale-up cooldown "
                       f"({since_s:.0f}s < {config.scale_up_cooldown_s:.0f}s)")
        return current
    if value < current and since_s < config.scale_down_cooldown_s:
        reasons.append(f"{role}: hold at {current}, scale-down cooldown "
                       f"({since_s:.0f}s < {config.scale_down_cooldown_s:.0f}s)")
        return current
    return value
