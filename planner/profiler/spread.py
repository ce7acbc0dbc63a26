"""The spread of served latencies around their medians, as the profile records it: a measured
distribution, not a mean, so that the simulator's tails come from what the host does.

A spread is `SPREAD_POINTS` deviations from the median, in seconds, at the quantiles
(i + 0.5) / SPREAD_POINTS of the pooled samples (ascending): each point stands for an equal share
of the measurements, so drawing one uniformly samples the distribution. Deviations are taken
within each group (one prompt length, one batched run) from that group's own median, so what the
engine model gets wrong from group to group is not read as spread, and the pooled median is ~0.

Deviations, not ratios: what spreads a served step is a wake-up of the API process, the router or
the client landing on the core, a delay of milliseconds whatever the step's length.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

SPREAD_POINTS = 20
MIN_SAMPLES = 8  # fewer pooled deviations than this: no spread is recorded (too few to place a p90)


def quantile_points(values: Sequence[float], points: int = SPREAD_POINTS) -> tuple[float, ...]:
    """`values` at the quantiles (i + 0.5) / points, i = 0 .. points - 1, interpolated linearly
    between order statistics; ascending. Raises ValueError for no values or points < 1."""
    if not values:
        raise ValueError("quantile_points needs at least one value")
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    ordered = sorted(float(v) for v in values)
    last = len(ordered) - 1
    out = []
    for i in range(points):
        position = (i + 0.5) / points * last
        low = int(position)
        high = min(low + 1, last)
        out.append(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
    return tuple(out)


def deviations_from_median(groups: Iterable[Sequence[float]]) -> list[float]:
    """Each sample minus its group's median, pooled over the groups (a group of one contributes 0)."""
    pooled: list[float] = []
    for group in groups:
        if group:
            middle = statistics.median(group)
            pooled += [float(v) - middle for v in group]
    return pooled


def spread_of(groups: Iterable[Sequence[float]], points: int = SPREAD_POINTS) -> tuple[float, ...]:
    """The recorded spread of `groups` of samples (seconds): `quantile_points` of their deviations
    from each group's median; () when fewer than MIN_SAMPLES samples were pooled."""
    pooled = deviations_from_median(groups)
    return quantile_points(pooled, points) if len(pooled) >= MIN_SAMPLES else ()


def spread_summary(spread: Sequence[float]) -> str:
    """'p10 -0.4 ms, p50 +0.0 ms, p90 +3.1 ms' of a recorded spread (its nearest points)."""
    def at(q: float) -> float:
        return spread[min(len(spread) - 1, int(q * len(spread)))]
    return ", ".join(f"p{round(q * 100)} {at(q) * 1e3:+.1f} ms" for q in (0.1, 0.5, 0.9))
