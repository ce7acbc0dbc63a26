"""Does a decode worker's step follow its core's interpreter speed? Window by window over a run.

On a Zen 4 EPYC VM a lone decode step followed a Python loop timed on its core one for one over
whole seconds (BENCHMARKS, "The decode step under load is the VM's interpreter speed"), which is
what `bench/validate_planner.py --at-run-speed series` assumes when it replays a run's interpreter
series on its decode steps. This reads the same from a validation's own rates: per window of the
series, the median of the steady decode steps' time over the model's for their batch and context
(`planner.validation_steps.steady_decode_steps`), against the window's interpreter factor; the
slope of one's log on the other's is the elasticity (1: the step moves as the loop does; 0: not
at all). Pure: numbers in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pdserve.engine_step_trace import TracedStep
from planner.validation_steps import steady_decode_steps

MIN_STEPS_PER_WINDOW = 5   # fewer steady steps in a window: its median is left out
MIN_WINDOWS = 8            # fewer paired windows: no elasticity is read


@dataclass(frozen=True)
class InterpreterSeries:
    """A run's interpreter series (`loadgen.host_probe.interpreter_series`: core -> ms per window
    from `start_s`, monotonic) and each worker's cores, by name."""

    by_core: dict[int, list[float | None]]
    start_s: float
    window_s: float
    cores: dict[str, tuple[int, ...]]

    def of_worker(self, worker: str) -> list[float | None]:
        return decode_core_series(self.by_core, self.cores.get(worker, ()))


@dataclass(frozen=True)
class SpeedElasticity:
    """`windows` paired windows: the slope of log(step over model) on log(interpreter factor), their
    correlation, and the slowest third of windows by the interpreter against the fastest third:
    how much slower the loop ran there and how much slower the steps did."""

    windows: int
    slope: float
    correlation: float
    interp_slow_over_fast: float
    step_slow_over_fast: float


def worker_elasticity(steps: Sequence[TracedStep], model_step_s: Callable[[int, int], float],
                      series: InterpreterSeries, worker: str) -> SpeedElasticity | None:
    """`elasticity` of `worker`'s traced steps to its cores' interpreter over `series`' windows."""
    interp = series.of_worker(worker)
    return elasticity(interp, step_ratio_by_window(steps, model_step_s, series.start_s, series.window_s, len(interp)))


def step_ratio_by_window(steps: Sequence[TracedStep], model_step_s: Callable[[int, int], float], start_s: float,
                         window_s: float, count: int) -> list[float | None]:
    """Per window of `window_s` from `start_s` (the series' windows, `count` of them), the median
    over the steady decode steps starting in it of step / `model_step_s(batch, context)`; None for
    a window with fewer than `MIN_STEPS_PER_WINDOW`."""
    buckets: list[list[float]] = [[] for _ in range(count)]
    for step in steady_decode_steps(steps):
        window = int((step.start_s - start_s) // window_s)
        model_s = model_step_s(step.batch, step.context_tokens)
        if 0 <= window < count and model_s > 0:
            buckets[window].append(step.duration_s / model_s)
    return [statistics.median(b) if len(b) >= MIN_STEPS_PER_WINDOW else None for b in buckets]


def elasticity(interp_ms: Sequence[float | None], step_ratio: Sequence[float | None]) -> SpeedElasticity | None:
    """The decode steps' elasticity to the interpreter over paired windows (both known); None
    under `MIN_WINDOWS` pairs or where the interpreter did not move at all."""
    pairs = [(i, s) for i, s in zip(interp_ms, step_ratio) if i is not None and s is not None and i > 0 and s > 0]
    if len(pairs) < MIN_WINDOWS:
        return None
    x, y = np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])
    if float(np.std(x)) == 0.0:
        return None
    slope = float(np.polyfit(x, y, 1)[0])
    correlation = float(np.corrcoef(x, y)[0, 1]) if float(np.std(y)) > 0 else 0.0
    ordered = sorted(pairs)
    third = max(1, len(ordered) // 3)
    fast, slow = ordered[:third], ordered[-third:]
    return SpeedElasticity(len(pairs), slope, correlation,
                           statistics.fmean(p[0] for p in slow) / statistics.fmean(p[0] for p in fast),
                           statistics.fmean(p[1] for p in slow) / statistics.fmean(p[1] for p in fast))


def decode_core_series(interp_by_core: dict[int, Sequence[float | None]], cores: Sequence[int]) -> list[float | None]:
    """A worker's interpreter series: the mean of its `cores`' windows (those with a sample)."""
    chosen = [interp_by_core[c] for c in cores if c in interp_by_core]
    out = []
    for window in zip(*chosen):
        known = [ms for ms in window if ms is not None]
        out.append(statistics.fmean(known) if known else None)
    return out
