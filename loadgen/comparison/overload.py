"""What a system keeps past its knee (pure): good requests per second and attainment among the
admitted requests at each offered rate, the knee, and whether the overload aims hold.

Definitions (`bench/overload.py` measures them):
- good req/s at an offered rate = the rate x the share of the offered requests that met the SLO
  pair (a refused, failed or late request is a miss): the steady-state rate of good requests, free
  of a short run's tail (the last requests finishing after the arrivals stop).
- attainment among admitted = the same share over the requests the server did not refuse at
  admission (HTTP 429 / RESOURCE_EXHAUSTED): what a client that was let in gets.
- the knee = the system's goodput on the rate grid (`loadgen.sweep.goodput_on_grid`: the rate at
  which attainment first falls below the target, interpolated).
- the aim holds at k x the knee when good req/s there is at least `keep` of the peak good req/s the
  system reached at or below that offered rate, and attainment among the admitted is at least the
  target. "Keeps" is read as "does not lose what it had reached": a system whose good req/s still
  rises past the knee (admission refusing the excess) keeps all of it at 1.5x even when its 2x point
  is higher; the peak over every rate would call that rise a loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.comparison.goodput import Measurement, attainment_curves
from loadgen.sweep import goodput_on_grid


@dataclass(frozen=True)
class OverloadPoint:
    system: str
    rate_rps: float
    good_rps: float
    attainment: float
    admitted_attainment: float | None   # None: every request was refused
    refused_share: float


@dataclass(frozen=True)
class OverloadVerdict:
    multiple: float              # of the knee
    rate_rps: float
    good_rps: float
    share_of_peak: float
    admitted_attainment: float | None
    holds: bool


def overload_points(measurements: Sequence[Measurement], pair: str) -> list[OverloadPoint]:
    """One point per measurement under SLO pair `pair`, sorted by system then rate (runs at the
    same rate in the order measured)."""
    points = []
    for m in sorted(measurements, key=lambda m: (m.system, m.rate_rps)):
        s = m.summaries[pair]
        sent = max(1, s["num_prompts"])
        admitted = s.get("admitted_slo_attainment") if s["num_prompts"] > s.get("refused", 0) else None
        points.append(OverloadPoint(m.system, m.rate_rps, m.rate_rps * s["slo_attainment"], s["slo_attainment"],
                                    admitted, s.get("refused", 0) / sent))
    return points


def knee_rps(measurements: Sequence[Measurement], system: str, pair: str, target: float = 0.9) -> tuple[float, bool]:
    """`system`'s knee under `pair`: (rate, bracketed) as `goodput_on_grid` gives it."""
    curve = attainment_curves([m for m in measurements if m.system == system], pair).get(system)
    if not curve:
        raise ValueError(f"no run of {system} to find its knee from")
    return goodput_on_grid(curve, target)


def overload_rates(knee: float, multiples: Sequence[float]) -> list[float]:
    """The offered rates k x knee, rounded to the millisecond of a req/s (how they are recorded)."""
    if not knee > 0:
        raise ValueError(f"the knee must be > 0 req/s to overload it, got {knee}")
    return [round(k * knee, 3) for k in multiples]


def verdicts(points: Sequence[OverloadPoint], system: str, knee: float, multiples: Sequence[float],
             keep: float = 0.9, target: float = 0.9) -> list[OverloadVerdict]:
    """For each multiple of the knee: `system`'s point there against the peak good req/s of its
    points at or below that rate (what it had reached before the load grew); a multiple not
    measured is left out. Where two runs share the rate (phase 1's grid held it too), the point
    judged is the last in `points` (phase 2's, which `overload_points` keeps after phase 1's)."""
    own = [p for p in points if p.system == system]
    found = []
    for multiple, rate in zip(multiples, overload_rates(knee, multiples)):
        point = next((p for p in reversed(own) if abs(p.rate_rps - rate) < 1e-6), None)
        if point is None:
            continue
        peak = max(p.good_rps for p in own if p.rate_rps <= rate + 1e-6)
        share = point.good_rps / peak if peak > 0 else 0.0
        admitted_ok = point.admitted_attainment is not None and point.admitted_attainment >= target
        found.append(OverloadVerdict(multiple, rate, point.good_rps, share, point.admitted_attainment,
                                     share >= keep and admitted_ok))
    return found
