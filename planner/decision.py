"""The online SLA planner's decision core: one interval's observations in, target pool sizes out.

Pure: no clock, no I/O. The loop around it reads the load, calls `decide`, and hands the target
to an actuator. The steps, each named in `Decision.reasons` when it changes something:

1. predict the next interval's arrival rate from the recent ones (`predictor`);
2. ask `plan(rate, mean_prompt, mean_output)` (the search over the simulator) for the fewest
   pool sizes meeting the SLOs; grow a pool to the plan at the predicted rate, shrink it only to
   the plan at the predicted rate plus `scale_down_headroom` (hysteresis: no flapping at a
   boundary);
3. reactive guard: a pool whose observed p90 breaks its SLO grows by one and never shrinks,
   whatever the model says (the model can be wrong; observations win);
4. move at most `max_step_up` / `max_step_down` replicas per pool per decision;
5. cooldown: no growth within `scale_up_cooldown_s` and no shrink within
   `scale_down_cooldown_s` of the last scaling action;
6. clamp to the per-pool bounds (always applied, cooldown or not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from planner.pool_sizes import ROLES, PoolSizes, Role

PlanFn = Callable[[float, float, float], PoolSizes | None]
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


def decide(state: ObservedLoad, config: PlannerConfig, plan: PlanFn) -> Decision:
    """The target pool sizes for the next interval. See the module docstring for the rules."""
    rate = predict_rate(state.rate_history_rps + (state.arrival_rate_rps,), config.predictor, config.window)
    reasons: list[str] = [f"predicted {rate:.3g} req/s ({config.predictor})"]
    wanted = _planned(state, config, plan, rate, reasons)
    wanted = _reactive(state, config, wanted, reasons)
    sizes = {}
    for role in ROLES:
        current, value = state.current.of(role), wanted[role]
        value = max(current - config.max_step_down, min(current + config.max_step_up, value))
        value = _cooldown(role, current, value, state.seconds_since_last_scale, config, reasons)
        low, high = config.min_sizes.of(role), config.max_sizes.of(role)
        if not low <= value <= high:
            reasons.append(f"{role}: {value} clamped to bounds [{low}, {high}]")
            value = max(low, min(high, value))
        sizes[role] = value
    return Decision(state.current, PoolSizes(**sizes), rate, tuple(reasons))


def _planned(state: ObservedLoad, config: PlannerConfig, plan: PlanFn, rate: float,
             reasons: list[str]) -> dict[Role, int]:
    if rate <= 0:
        reasons.append("no traffic predicted: minimum sizes")
        return config.min_sizes.as_dict()
    up = plan(rate, state.mean_prompt_tokens, state.mean_output_tokens)
    if up is None:
        reasons.append("no pool sizes in the search meet the SLOs at this load: maximum sizes")
        return config.max_sizes.as_dict()
    down = plan(rate * (1 + config.scale_down_headroom), state.mean_prompt_tokens, state.mean_output_tokens)
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
              reasons: list[str]) -> dict[Role, int]:
    checks: tuple[tuple[Role, float | None, float, str], ...] = (
        ("prefill", state.ttft_p90_s, config.ttft_slo_s, "TTFT"),
        ("decode", state.tpot_p90_s, config.tpot_slo_s, "TPOT"))
    out = dict(wanted)
    for role, observed, slo, name in checks:
        current = state.current.of(role)
        if observed is not None and observed > slo and out[role] <= current:
            out[role] = current + 1
            reasons.append(f"{role}: observed p90 {name} {observed:.3g}s > SLO {slo:.3g}s: +1")
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
