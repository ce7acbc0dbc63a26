"""How steady this machine's cores are: the pure half of bench/host_speed.py.

A benchmark compares systems run one after another and trusts that the machine ran at one speed.
The quiet check (`loadgen.proc_cpu.wait_for_quiet`) sees other processes inside this VM; it does
not see the host under the VM: a neighbour on the same physical core, or a clock that moves. The
probe times one fixed matrix product again and again on each core, in windows of a second or two,
first each core alone and then both at once (as a 1P+1D cluster runs them). From those windows:

- a phase's swing is p90 / p10 of its windows' milliseconds per product: 1.0 on a steady machine;
- the together/alone ratio is the median with both cores busy over the median alone: above 1 when
  the two virtual cores share something underneath (a physical core, its caches or its matrix
  unit), which the planner's one-core tables, measured with the other core idle, do not hold.

`verdict` says whether figures taken on the machine can be compared at the level a benchmark
claims (its `max_swing`, default 1.25: a run-to-run difference under 25% is within the machine's
own swing otherwise).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_SWING = 1.25


@dataclass(frozen=True)
class PhaseSpeed:
    """The windows of one phase (one core alone, or every core together) in ms per product."""

    name: str
    p10_ms: float
    p50_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    windows: int

    @property
    def swing(self) -> float:
        """p90 / p10 of the windows: how far the machine's speed moved within the phase."""
        return self.p90_ms / self.p10_ms


def phase_speed(name: str, window_ms: Sequence[float]) -> PhaseSpeed:
    """Summarises one phase's windows; ValueError on none or on a non-positive window."""
    values = [float(v) for v in window_ms]
    if not values:
        raise ValueError(f"phase {name!r}: no windows were timed")
    if min(values) <= 0:
        raise ValueError(f"phase {name!r}: a window took {min(values)} ms per product (must be > 0)")
    p10, p50, p90 = (float(np.percentile(values, q)) for q in (10, 50, 90))
    return PhaseSpeed(name, p10, p50, p90, min(values), max(values), len(values))


def together_over_alone(alone: Sequence[PhaseSpeed], together: Sequence[PhaseSpeed]) -> float:
    """Median ms per product with every core busy over the median of the cores alone: 1.0 when the
    cores share nothing that slows them."""
    return statistics.median(p.p50_ms for p in together) / statistics.median(p.p50_ms for p in alone)


@dataclass(frozen=True)
class Verdict:
    steady: bool
    worst_swing: float
    sharing: float   # together_over_alone
    text: str


def verdict(alone: Sequence[PhaseSpeed], together: Sequence[PhaseSpeed], max_swing: float = MAX_SWING) -> Verdict:
    """`alone` and `together`: a PhaseSpeed per core each. Steady when no phase swings by more than
    `max_swing` and the cores do not slow each other by more than it either."""
    if max_swing <= 1.0:
        raise ValueError(f"max_swing must be > 1, got {max_swing}")
    worst = max([*alone, *together], key=lambda p: p.swing)
    sharing = together_over_alone(alone, together)
    notes = []
    if worst.swing > max_swing:
        notes.append(f"its speed swings: {worst.name} ran {worst.p10_ms:.2f}-{worst.p90_ms:.2f} ms per product "
                     f"(p10-p90, {worst.swing:.2f}x; slowest window {worst.max_ms:.2f})")
    if sharing > max_swing:
        notes.append(f"its cores slow each other: {sharing:.2f}x slower with both busy than alone")
    steady = not notes
    text = ("steady: every phase within {:.2f}x, both cores busy {:.2f}x of alone".format(worst.swing, sharing)
            if steady else "not steady: " + "; ".join(notes)
            + f". Differences under {max(worst.swing, sharing) - 1:.0%} between runs are within the machine's own")
    return Verdict(steady, worst.swing, sharing, text)


def speed_factors(ms_per_product: Sequence[float | None]) -> list[float | None]:
    """Each run's machine speed against the run's median: ms per product over the median of every
    run measured (1.0: as usual; 1.4: the machine computed 1.4x slower just before that run).
    None where a run has no check; ValueError on a non-positive figure."""
    measured = [v for v in ms_per_product if v is not None]
    if any(v <= 0 for v in measured):
        raise ValueError(f"ms per product must be > 0, got {min(measured)}")
    if not measured:
        return [None for _ in ms_per_product]
    median = statistics.median(measured)
    return [None if v is None else v / median for v in ms_per_product]


def speed_summary(ms_per_product: Sequence[float | None], labels: Sequence[str], max_swing: float = MAX_SWING) -> str:
    """One line for a report: the spread of the checks before each run, and which runs started on a
    machine more than `max_swing` slower than its median (their figures carry that)."""
    if len(labels) != len(ms_per_product):
        raise ValueError(f"{len(labels)} labels for {len(ms_per_product)} figures")
    factors = speed_factors(ms_per_product)
    measured = [v for v in ms_per_product if v is not None]
    if not measured:
        return "the machine's speed was not checked before the runs"
    p10, p50, p90 = (float(np.percentile(measured, q)) for q in (10, 50, 90))
    slow = [f"{label} (x{f:.2f})" for label, f in zip(labels, factors) if f is not None and f > max_swing]
    return (f"machine speed before each run: median {p50:.2f} ms per product, p10-p90 {p10:.2f}-{p90:.2f} "
            f"({p90 / p10:.2f}x) over {len(measured)} runs; "
            + (f"{len(slow)} started over {max_swing:g}x slower than the median: {', '.join(slow)}" if slow
               else f"none started over {max_swing:g}x slower than the median"))


def drift_note(start_ms: float, end_ms: float, max_swing: float = MAX_SWING, product: str = "") -> str:
    """One line on how far the machine's speed moved between two checks of a long measurement (a
    profile's start and end), naming the `product` timed where given; "" when neither was checked (0)."""
    if start_ms <= 0 or end_ms <= 0:
        return ""
    unit = f"ms per {product} product" if product else "ms per product"
    return (f"machine speed {start_ms:.2f} {unit} at the start, {end_ms:.2f} at the end "
            f"({_moved(start_ms, end_ms, max_swing, 'the tables')})")


def wake_note(start_us: float, end_us: float, max_swing: float = MAX_SWING) -> str:
    """One line on the cross-core wake-up round trip at a profile's start and end
    (`loadgen.host_probe.wake_check_us`); "" when not checked (0)."""
    if start_us <= 0 or end_us <= 0:
        return ""
    return (f"wake-up round trip {start_us:.0f} us at the start, {end_us:.0f} at the end "
            f"({_moved(start_us, end_us, max_swing, 'the serving costs')})")


def _moved(start: float, end: float, max_swing: float, measured: str) -> str:
    drift = max(start, end) / min(start, end)
    return (f"it moved {drift:.2f}x while measured: {measured} hold at neither speed exactly" if drift > max_swing
            else f"within {drift:.2f}x")
