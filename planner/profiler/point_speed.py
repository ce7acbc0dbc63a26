"""Each timed point of a profile set against the machine's speed when it was read, and moved to the
profile's mean speed.

A shared VM runs Python 1.3-1.8x slower for seconds at a time (a profile's interpreter windows,
p10-p90: 1.65x on a Zen 3 EPYC, 1.83x on a Zen 5; BENCHMARKS, "On a Zen 5 EPYC"), and a decode
step, made of small kernels and the engine's Python, slows with it: a loaded cluster's step by
about half the interpreter's swing (elasticity 0.39-0.51 per 1 s window), a lone engine's up to
one for one (a Zen 4 VM). Each table point lands in whichever second it ran in, so two profiles of
one VM disagree point by point and a fit leans on its slow seconds (the served-step line on the
Zen 5 EPYC took +1.2 to +10.8 ms of extra from batch to batch). The profile keeps every core's
interpreter second by second (`HardwareInfo.machine_interp_series_ms`) and when each decode row
and each batched run was read (`DecodeSample.start_s`, `ServingCosts.served_batch_windows_s`);
here a point read where the machine ran at `ratio` times its mean is moved to the mean:

    step at the mean = step / ratio ** elasticity

(in logs, as `planner.simulator.speed.DecodeSpeed.with_elasticity` and validate_planner's
--speed-elasticity take it: 0.5, a 1.44x slower loop, a 1.2x longer step).

`ratio` is the mean over every core of the windows the point overlaps (each weighted by the
overlap) over the mean of every window of every core: the engine's core and its front end's both
run the step's Python. Prefill rows are left as measured (a prompt is the matmuls the compute
check times, which held within 1.00-1.03x where the loop swung), though they keep their times too.

Pure: plain values and profiles in, the same out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.perf_model import fit_perf_model
from planner.profile import DecodeSample, HardwareInfo, Profile
from planner.profiler.served_refit import refitted


@dataclass(frozen=True)
class SpeedSeries:
    """A profile's interpreter windows: each core's mean ms of the check loop per `window_s` from
    `start_s` (None: a window without a sample)."""

    start_s: float
    window_s: float
    by_core: tuple[tuple[int, tuple[float | None, ...]], ...]

    @classmethod
    def of(cls, hardware: HardwareInfo) -> SpeedSeries | None:
        """The profile's series, or None where it kept none (or not when it began)."""
        if hardware.machine_interp_start_s <= 0 or not hardware.machine_interp_series_ms:
            return None
        series = cls(hardware.machine_interp_start_s, hardware.machine_interp_window_s,
                     hardware.machine_interp_series_ms)
        return series if series.values() else None

    def values(self) -> list[float]:
        return [ms for _, per_core in self.by_core for ms in per_core if ms is not None]

    @property
    def mean_ms(self) -> float:
        """Every window of every core: the speed the profile's points are moved to."""
        return statistics.fmean(self.values())

    def ms_over(self, start_s: float, end_s: float) -> float | None:
        """The mean over every core of the windows [start_s, end_s] overlaps, each weighted by the
        overlap (a span inside one window, or of no length: that window); None where no window it
        touches has a sample (a span outside the series)."""
        if end_s < start_s:
            raise ValueError(f"a span must end after it starts, got [{start_s}, {end_s}]")
        first = math.floor((start_s - self.start_s) / self.window_s)
        last = max(first, math.ceil((end_s - self.start_s) / self.window_s) - 1)
        total = weights = 0.0
        for k in range(first, last + 1):
            lo, hi = self.start_s + k * self.window_s, self.start_s + (k + 1) * self.window_s
            weight = (min(hi, end_s) - max(lo, start_s)) if end_s > start_s else 1.0
            for _, per_core in self.by_core:
                if 0 <= k < len(per_core) and per_core[k] is not None and weight > 0:
                    total, weights = total + weight * per_core[k], weights + weight
        return total / weights if weights else None

    def ratio_over(self, start_s: float, end_s: float) -> float | None:
        """How much slower than its mean the machine ran Python over [start_s, end_s] (1: at the
        mean; above 1: slower); None where the series does not cover it."""
        ms = self.ms_over(start_s, end_s)
        return None if ms is None else ms / self.mean_ms


def at_mean_speed(step_s: float, ratio: float, elasticity: float) -> float:
    """A step read where the machine ran at `ratio` times its mean, moved to the mean: the step
    follows the machine at `elasticity` of its swing in logs (0: not at all; 1: one for one)."""
    if ratio <= 0 or elasticity < 0:
        raise ValueError(f"need ratio > 0 and elasticity >= 0, got {ratio}, {elasticity}")
    return step_s / ratio ** elasticity


def rows_at_mean_speed(rows: Sequence[DecodeSample], series: SpeedSeries,
                       elasticity: float) -> tuple[tuple[DecodeSample, ...], list[float | None]]:
    """`rows` each moved to the series' mean speed (`at_mean_speed`), and each row's ratio (None:
    a row without its time, or outside the series: left as it was)."""
    moved, ratios = [], []
    for row in rows:
        ratio = series.ratio_over(row.start_s, row.end_s) if row.timed else None
        ratios.append(ratio)
        moved.append(row if ratio is None else replace(row, step_s=at_mean_speed(row.step_s, ratio, elasticity)))
    return tuple(moved), ratios


def runs_at_mean_speed(runs: Sequence[tuple[float, float, float, float]], windows: Sequence[tuple[float, float]],
                       series: SpeedSeries, elasticity: float) -> tuple[tuple[float, float, float, float], ...]:
    """Kept batched runs (`ServingCosts.served_batch_runs`) with each served step moved to the
    series' mean speed over its window (`served_batch_windows_s`; none kept: as they were)."""
    if not windows:
        return tuple(runs)
    moved = []
    for (batch, step_s, context, tokens_per_s), (start_s, end_s) in zip(runs, windows):
        ratio = series.ratio_over(start_s, end_s) if end_s > 0 else None
        moved.append((batch, step_s if ratio is None else at_mean_speed(step_s, ratio, elasticity), context,
                      tokens_per_s))
    return tuple(moved)


def profile_at_mean_speed(profile: Profile, elasticity: float, served_elasticity: float | None = None) -> Profile:
    """`profile` with every timed decode row (its own table and each wide engine's) and every
    timed batched run moved to the profile's mean interpreter speed, and the served step (its line
    and table) fitted again from the moved runs against the moved engine table. `elasticity`: the
    engine rows'; `served_elasticity` (None: the same): the batched runs'. The profile unchanged
    where it kept no series."""
    series = SpeedSeries.of(profile.hardware)
    if series is None:
        return profile
    served_elasticity = elasticity if served_elasticity is None else served_elasticity
    decode, _ = rows_at_mean_speed(profile.decode, series, elasticity)
    wide = tuple(replace(engine, decode=rows_at_mean_speed(engine.decode, series, elasticity)[0])
                 for engine in profile.wide)
    moved = replace(profile, decode=decode, wide=wide)
    serving = profile.serving
    if serving.served_batch_windows_s:
        serving = refitted(replace(serving, served_batch_runs=runs_at_mean_speed(
            serving.served_batch_runs, serving.served_batch_windows_s, series, served_elasticity)),
            fit_perf_model(moved).model, decode)
    return replace(moved, serving=serving)
