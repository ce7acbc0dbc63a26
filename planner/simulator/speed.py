"""The machine's speed as it moved: a decode-side instance's steps slower or faster window by window.

A shared VM does not run at one speed. On two EPYC kinds the cores ran Python at one speed or
another 1.2-1.6x apart for seconds at a time, with a matrix product beside them unmoved, and a
small model's decode step (the engine's scheduling and its kernels' dispatch) followed that speed
one for one over whole seconds (BENCHMARKS, "The decode step under load is the VM's interpreter
speed"). A mean factor moves every step alike; what makes some requests' TPOT slow and others'
not is the speed's time structure, which a series keeps.

`DecodeSpeed` holds one series per decode-side instance (instance i takes series i mod their
count): factors over the speed the model was fitted at (1.0: as profiled; 1.3: 30% slower), one
per `window_s` from the simulation's time 0. A step takes the factor of the window it starts in;
past a series' end, 1.0. Pure: numbers in, factors out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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

    def factor(self, instance: int, now_s: float) -> float:
        """The factor of decode-side `instance`'s step starting at `now_s` (s from the simulation's
        start; before 0 or past the series' end, 1.0)."""
        if not self.series:
            return 1.0
        factors = self.series[instance % len(self.series)]
        window = int(now_s // self.window_s)
        return factors[window] if 0 <= window < len(factors) else 1.0
