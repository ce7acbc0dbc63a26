"""One topology's goodput: the highest rate at which its attainment meets the target, as a pure
function of an attainment oracle (`attainment(rate_rps) -> float`, the share of requests meeting
every SLO; the simulator provides it, tests pass a formula).

`max_rate` is DistServe's goodput, found by doubling or halving to a bracket and then bisection to
a relative tolerance, then checked at 90/80/70% of the answer: a rate there that misses means
service broke below the answer (a finite sample's attainment does not fall smoothly with the rate,
least of all with an admission that learns), and the search runs again below it, so the answer is
where service first breaks, as `loadgen.sweep.goodput_on_grid` measures a comparison. Measured: an
AMX Xeon's plan read 2C@1024 at 0.76 at 7.5 req/s and 0.90 at 8.25, where bisection alone stopped.
`planner.search` runs it over topologies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MAX_BRACKET_STEPS = 40
FIRST_BREAK_CHECKS = (0.9, 0.8, 0.7)  # fractions of a rate found that must pass too
MAX_BREAK_RECHECKS = 3                # searches again below a break before the answer stands


@dataclass(frozen=True)
class SearchSettings:
    target_attainment: float = 0.9
    rate_hint_rps: float = 1.0  # first rate tried, per device
    rel_tol: float = 0.02  # bisection stops when (hi - lo) <= rel_tol * lo
    min_rate_rps: float = 1e-3  # below this a topology counts as never meeting the SLOs

    def __post_init__(self) -> None:
        if not 0 < self.target_attainment <= 1:
            raise ValueError(f"target_attainment must be in (0, 1], e.g. 0.9; got {self.target_attainment}")
        if not (self.rate_hint_rps > 0 and self.min_rate_rps > 0 and 0 < self.rel_tol < 1):
            raise ValueError("rate_hint_rps and min_rate_rps must be > 0 and rel_tol in (0, 1), got "
                             f"{self.rate_hint_rps}, {self.min_rate_rps}, {self.rel_tol}")


def max_rate(attainment: Callable[[float], float], settings: SearchSettings,
             rate_hint_rps: float | None = None) -> tuple[float, float, tuple[tuple[float, float], ...]]:
    """(max rate meeting the target, attainment there, samples). 0.0 if none >= min_rate_rps."""
    target = settings.target_attainment
    samples: list[tuple[float, float]] = []

    def passes(rate: float) -> bool:
        value = attainment(rate)
        samples.append((rate, value))
        return value >= target

    def none_passes() -> tuple[float, float, tuple[tuple[float, float], ...]]:
        return 0.0, min(samples, key=lambda s: s[0])[1], tuple(samples)

    rate = rate_hint_rps or settings.rate_hint_rps
    if passes(rate):
        lo, hi = rate, None
        for _ in range(MAX_BRACKET_STEPS):
            if not passes(lo * 2):
                hi = lo * 2
                break
            lo *= 2
        if hi is None:
            raise ValueError(f"attainment still >= {target} at {lo:g} req/s: the attainment function "
                             "does not fall with the rate; check the workload and SLOs")
    else:
        lo, hi = _halve_to_a_pass(passes, rate, settings.min_rate_rps)
        if lo == 0.0:
            return none_passes()
    lo = _bisect(passes, lo, hi, settings.rel_tol)
    for _ in range(MAX_BREAK_RECHECKS):
        broken = [lo * f for f in FIRST_BREAK_CHECKS if not passes(lo * f)]
        if not broken:
            break
        hi = min(broken)
        lo = max((r for r, value in samples if r < hi and value >= target), default=0.0)
        if lo == 0.0:
            lo, hi = _halve_to_a_pass(passes, hi, settings.min_rate_rps)
            if lo == 0.0:
                return none_passes()
        lo = _bisect(passes, lo, hi, settings.rel_tol)
    at_lo = max(value for rate, value in samples if rate == lo)
    return lo, at_lo, tuple(samples)


def _halve_to_a_pass(passes: Callable[[float], bool], failing: float, min_rate_rps: float) -> tuple[float, float]:
    """(lo, hi): halving down from `failing` (a rate that misses), the first rate that passes and
    the failing one above it; lo 0.0 when none does down to `min_rate_rps`."""
    hi = failing
    while hi / 2 >= min_rate_rps:
        if passes(hi / 2):
            return hi / 2, hi
        hi /= 2
    return 0.0, hi


def _bisect(passes: Callable[[float], bool], lo: float, hi: float, rel_tol: float) -> float:
    """The highest passing rate bisection finds between `lo` (passes) and `hi` (fails)."""
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo
