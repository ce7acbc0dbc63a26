"""The machine's speed as it moved: a decode-side instance's steps slower or faster window by window.

A shared VM does not run at one speed. On two EPYC kinds the cores ran Python at one speed or
another 1.2-1.6x apart for seconds at a time, with a matrix product beside them unmoved, and a
small model's lone decode step (the engine's scheduling and its kernels' dispatch) followed that
speed one for one over whole seconds on a Zen 4 VM (BENCHMARKS, "The decode step under load is the
VM's interpreter speed"); loaded, on a Zen 5 VM, at about half its swing (elasticity 0.51, "On a
Zen 5 EPYC"). A mean factor moves every step alike; a series keeps the speed's time structure,
which could make some requests' TPOT slow and others' not. Measured: on the Zen 5 VM the series
predicted TPOT no better than the mean did (its windows follow the step loosely), so a planner
does not use it; it stays a what-if of the validation.

`DecodeSpeed` holds one series per decode-side instance (instance i takes series i mod their
count): factors over the speed the model was fitted at (1.0: as profiled; 1.3: 30% slower), one
per `window_s` from the simulation's time 0. A step takes the factor of the window it starts in
(a colocated or hybrid instance's whole step, its prompt chunks with it); past a series' end, 1.0.
The series is the run's own (a validation's what-if, `--at-run-speed series`) or drawn from the
profile's (`drawn_series`, `--speed-from-profile`). Pure: numbers in, factors out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.simulator.config import SimulationError


@dataclass(frozen=True)
class DecodeSpeed:
    """Each decode-side instance's speed factor window by window (see the module doc); no series:
    every step at the model's speed."""

    series: tuple[tuple[float, ...], ...] = ()
    window_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise SimulationError(f"DecodeSpeed.window_s must be > 0, got {self.window_s!r}")
        for index, factors in enumerate(self.series):
            if not all(f > 0 for f in factors):
                raise SimulationError(f"DecodeSpeed.series[{index}] holds a factor <= 0: every factor is a "
                                      f"speed over the profile's (1.0: as profiled), got {list(factors)}")

    @classmethod
    def of(cls, series: Sequence[Sequence[float]], window_s: float = 1.0) -> "DecodeSpeed":
        return cls(tuple(tuple(float(f) for f in factors) for factors in series), window_s)

    @classmethod
    def drawn(cls, windows_by_core: Sequence[Sequence[float | None]], mean_ms: float, window_s: float,
              instances: int, length_s: float, seed: int) -> "DecodeSpeed":
        """One `drawn_series` per decode-side instance (seeds `seed`, `seed` + 1, ...) covering
        `length_s`; no series where the profile kept none."""
        length = int(np.ceil(length_s / window_s))
        series = [drawn_series(windows_by_core, mean_ms, length, seed + i) for i in range(instances)]
        return cls.of([s for s in series if s], window_s)

    def with_elasticity(self, elasticity: float) -> "DecodeSpeed":
        """These factors raised to `elasticity`: a step that moves `elasticity` times as much (in
        logs) as the speed measured (1.0: one for one; 0.5: a 1.44x slower loop, a 1.2x longer step)."""
        if elasticity == 1.0:
            return self
        return DecodeSpeed.of([[f ** elasticity for f in factors] for factors in self.series], self.window_s)

    def factor(self, instance: int, now_s: float) -> float:
        """The factor of decode-side `instance`'s step starting at `now_s` (s from the simulation's
        start; before 0 or past the series' end, 1.0)."""
        if not self.series:
            return 1.0
        factors = self.series[instance % len(self.series)]
        window = int(now_s // self.window_s)
        return factors[window] if 0 <= window < len(factors) else 1.0


SPEED_BLOCK_WINDOWS = 10   # a drawn series' blocks: the slow mode seen lasting seconds, not one window


def drawn_series(windows_by_core: Sequence[Sequence[float | None]], mean_ms: float, length: int, seed: int,
                 block_windows: int = SPEED_BLOCK_WINDOWS) -> tuple[float, ...]:
    """A speed series of `length` windows drawn from a profile's own (`HardwareInfo.
    machine_interp_series_ms`' series, ms per window): blocks of `block_windows` consecutive windows
    of one core, each block's start drawn uniformly (seeded), end to end; each window's ms over
    `mean_ms` (a window without a sample: 1.0). A block bootstrap: the factors keep the profile's
    distribution and, within a block, how long a mode lasted, without the one order it came in.
    () where the profile has no window or `length` < 1."""
    if mean_ms <= 0:
        raise SimulationError(f"drawn_series needs the profile's mean interpreter ms > 0, got {mean_ms!r}")
    if block_windows < 1:
        raise SimulationError(f"drawn_series needs block_windows >= 1, got {block_windows!r}")
    block_windows = min(block_windows, max((len(series) for series in windows_by_core), default=0))
    starts = [(core, start) for core, series in enumerate(windows_by_core)
              for start in range(max(0, len(series) - block_windows + 1))]
    if not starts or length < 1:
        return ()
    rng, out = np.random.default_rng(seed), []
    while len(out) < length:
        core, start = starts[int(rng.integers(len(starts)))]
        out += [1.0 if ms is None else ms / mean_ms for ms in windows_by_core[core][start:start + block_windows]]
    return tuple(out[:length])
