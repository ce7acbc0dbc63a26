"""Goodput search: the highest offered rate at which >= `target` of requests meet their SLOs.

Pure decision code over a `measure(rate_rps) -> attainment` callable (a real benchmark run, a
simulator, or a known curve in tests). Attainment is assumed to fall as the rate rises.

1. Bracket: probe `start_rps`; while it passes, double (up to `max_rps`); while it fails,
   halve (down to `min_rps`). This yields a passing rate `lo` below a failing rate `hi`.
2. Bisect between them until (hi - lo) <= rel_tol * hi or `max_probes` probes are spent.

The answer is always a rate that was measured and passed (0 when even `min_rps` fails, and
`max_rps` when it passes); every probe is returned, so a noisy, non-monotone curve is visible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SearchConfig:
    start_rps: float = 1.0
    min_rps: float = 0.05
    max_rps: float = 64.0
    target: float = 0.9  # required SLO attainment (DistServe: 90%)
    rel_tol: float = 0.05
    max_probes: int = 12

    def __post_init__(self) -> None:
        if not 0 < self.min_rps <= self.start_rps <= self.max_rps:
            raise ValueError(
                f"need 0 < min_rps <= start_rps <= max_rps, got {self.min_rps}, {self.start_rps}, {self.max_rps}"
            )
        if not 0 < self.target <= 1:
            raise ValueError(f"target attainment must be in (0, 1], got {self.target}")
        if not 0 < self.rel_tol < 1:
            raise ValueError(f"rel_tol must be in (0, 1), got {self.rel_tol}")
        if self.max_probes < 1:
            raise ValueError(f"max_probes must be >= 1, got {self.max_probes}")


@dataclass(frozen=True)
class Probe:
    rate_rps: float
    attainment: float
    passed: bool


@dataclass(frozen=True)
class SearchResult:
    goodput_rps: float  # highest passing rate found (0.0: none passed)
    probes: tuple[Probe, ...]  # in the order measured
    bracketed: bool  # False when the answer sits at min_rps/max_rps or probes ran out first

    @property
    def curve(self) -> list[tuple[float, float]]:
        """(rate, attainment) sorted by rate, for plotting."""
        return sorted((p.rate_rps, p.attainment) for p in self.probes)


def find_goodput(measure: Callable[[float], float], config: SearchConfig = SearchConfig()) -> SearchResult:
    probes: list[Probe] = []

    def probe(rate_rps: float) -> bool:
        attainment = float(measure(rate_rps))
        probes.append(Probe(rate_rps, attainment, attainment >= config.target))
        return probes[-1].passed

    lo, hi = _bracket(probe, config, lambda: len(probes))
    if lo is None:
        return SearchResult(0.0, tuple(probes), bracketed=False)
    if hi is None:
        return SearchResult(lo, tuple(probes), bracketed=False)
    while hi - lo > config.rel_tol * hi and len(probes) < config.max_probes:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    return SearchResult(lo, tuple(probes), bracketed=hi - lo <= config.rel_tol * hi)


def _bracket(probe: Callable[[float], bool], config: SearchConfig,
             spent: Callable[[], int]) -> tuple[float | None, float | None]:
    """(passing lo, failing hi); lo None: nothing passed; hi None: nothing failed."""
    rate = config.start_rps
    if probe(rate):
        while rate < config.max_rps and spent() < config.max_probes:
            higher = min(rate * 2, config.max_rps)
            if not probe(higher):
                return rate, higher
            rate = higher
        return rate, None
    while rate > config.min_rps and spent() < config.max_probes:
        lower = max(rate / 2, config.min_rps)
        if probe(lower):
            return lower, rate
        rate = lower
    return None, rate


def goodput_on_grid(curve: Sequence[tuple[float, float]], target: float = 0.9) -> tuple[float, bool]:
    """The goodput from attainment measured on a fixed grid of rates (`[(rate_rps, attainment)]`),
    as benchmarks that interleave systems rate by rate measure it; returns (goodput_rps, bracketed).

    Walking up from the lowest rate, the goodput lies between the last passing rate and the first
    failing one; it is the linear interpolation of the `target` crossing between those two points
    (bracketed=True). When the lowest rate already fails it is 0.0, and when no rate fails it is the
    highest rate (both bracketed=False: the true value lies outside the grid). A rate passing again
    above the first failure is ignored: the answer is where service first breaks.
    """
    points = _sorted_curve(curve)
    if points[0][1] < target:
        return 0.0, False
    if (bracket := _first_crossing(points, target)) is None:
        return points[-1][0], False
    (lo_rps, lo_att), (hi_rps, hi_att) = bracket
    return lo_rps + (lo_att - target) / (lo_att - hi_att) * (hi_rps - lo_rps), True


def _sorted_curve(curve: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    if not curve:
        raise ValueError("the curve is empty: measure at least one rate")
    return sorted(curve)


def _first_crossing(points: Sequence[tuple[float, float]], target: float):
    """The last passing point and the first failing one after it, walking up the sorted `points`
    (the lowest passing); None when none fails."""
    return next(((lo, hi) for lo, hi in zip(points, points[1:]) if hi[1] < target), None)


def knee_midpoint(curve: Sequence[tuple[float, float]], target: float = 0.9,
                  min_gap: float = 0.05) -> float | None:
    """The rate to measure next to find the goodput of a curve measured on a grid
    (`[(rate_rps, attainment)]`): the midpoint of the bracket `goodput_on_grid` interpolates across
    (the last passing rate below the first failing one), rounded to 3 decimals; None when the grid
    does not bracket the target (the lowest rate fails, or none does) or the bracket is already
    narrower than `min_gap` of its failing rate. A grid 30% apart across a cliff in attainment
    interpolates a goodput anywhere in the bracket; each midpoint halves it."""
    points = _sorted_curve(curve)
    if points[0][1] < target or (bracket := _first_crossing(points, target)) is None:
        return None
    (lo_rps, _), (hi_rps, _) = bracket
    return None if hi_rps - lo_rps <= min_gap * hi_rps else round((lo_rps + hi_rps) / 2, 3)


# How far past the grid a refinement steps when the grid does not bracket the target: the grid's
# own spacing at its top (30%, `validation_runs.auto_rates`), so an extension lands where a longer
# grid would have.
GRID_STEP = 1.3


def next_bracketing_rate(curve: Sequence[tuple[float, float]], target: float = 0.9, min_gap: float = 0.05,
                         step: float = GRID_STEP) -> float | None:
    """The rate to measure next so that a grid's goodput (`goodput_on_grid`) becomes known: above
    the highest rate by `step` while every rate meets `target` (the goodput lies past the grid),
    below the lowest by `step` while it misses (the goodput lies under it), else the bracket's
    midpoint (`knee_midpoint`); None when the bracket is already narrower than `min_gap` of its
    failing rate. Rounded to 3 decimals."""
    points = _sorted_curve(curve)
    if points[0][1] < target:
        return round(points[0][0] / step, 3)
    if _first_crossing(points, target) is None:
        return round(points[-1][0] * step, 3)
    return knee_midpoint(points, target, min_gap)


def stopped_search(curve: Sequence[tuple[float, float]], target: float = 0.9) -> SearchResult:
    """What a search that stopped early (a failed probe, an interrupt) still says, from the
    `[(rate_rps, attainment)]` measured in order: the highest passing rate below every failing
    rate measured (0.0 when none), never bracketed (the search did not finish)."""
    probes = tuple(Probe(rate, attainment, attainment >= target) for rate, attainment in curve)
    lowest_fail = min((p.rate_rps for p in probes if not p.passed), default=float("inf"))
    passing = [p.rate_rps for p in probes if p.passed and p.rate_rps < lowest_fail]
    return SearchResult(max(passing, default=0.0), probes, bracketed=False)
