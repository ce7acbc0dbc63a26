"""The machine's speed in a validation: whether a decode worker's step follows its core's
interpreter window by window, and the what-ifs that simulate a run at its own speed.

On a Zen 4 EPYC VM a lone decode step followed a Python loop timed on its core one for one over
whole seconds (BENCHMARKS, "The decode step under load is the VM's interpreter speed"), which is
what `bench/validate_planner.py --at-run-speed series` assumes when it replays a run's interpreter
series on its decode steps. This reads the same from a validation's own rates: per window of the
series, the median of the steady decode steps' time over the model's for their batch and context
(`planner.validation_steps.steady_decode_steps`), against the window's interpreter factor; the
slope of one's log on the other's is the elasticity (1: the step moves as the loop does; 0: not
at all). `at_run_speed_as` and `with_profile_speed` simulate a rate at its own measured speed
or at speeds drawn from the profile's (`bench/validate_planner.py --at-run-speed`,
`--speed-from-profile`, `--speed-elasticity`); `machine_against_profile` says how the rate's
machine compared. Pure: numbers in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from loadgen.host_probe import INTERPRETER_WINDOW_S
from pdserve.engine_step_trace import TracedStep
from planner.perf_model import PerfModel
from planner.profile import HardwareInfo
from planner.simulator import DecodeSpeed, SimSettings, Topology
from planner.validation_steps import steady_decode_steps

if TYPE_CHECKING:   # validation_runs compares through this module's what-ifs
    from planner.validation_runs import RateRun

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


def run_speed_factors(machine: Mapping[str, Any] | None, hardware: HardwareInfo) -> tuple[float, float]:
    """How much slower than at its profile a rate's machine ran (`RateRun.machine`): its compute
    check over the profile's (the prompts' factor) and its interpreter's mean over the profile's
    (the decode steps'); 1.0 for either the run or the profile lacks, and a compute factor of 1.0
    where the rate timed another product than the profile did (its `product`; records before it
    timed the first profile's, taken as this one's)."""
    machine = machine or {}
    same_product = machine.get("product", hardware.machine_product) == hardware.machine_product

    def factor(key: str, profiled: float) -> float:
        return float(machine[key]) / profiled if profiled > 0 and float(machine.get(key, 0)) > 0 else 1.0

    return (factor("ms_per_product", hardware.machine_ms) if same_product else 1.0,
            factor("interp_ms", hardware.machine_interp_ms))


RUN_SPEEDS = ("mean", "series")   # `--at-run-speed`: the rate's mean speed, or its decode core's second by second


def run_speed_mode(asked: object) -> str | None:
    """`what_if["at_run_speed"]`: None or False (nominal), True (records before the series: "mean")
    or one of `RUN_SPEEDS`; raises ValueError for another."""
    if asked is None or asked is False:
        return None
    mode = "mean" if asked is True else asked
    if mode not in RUN_SPEEDS:
        raise ValueError(f"at_run_speed must be one of {RUN_SPEEDS}, got {asked!r}")
    return mode


def at_run_speed_as(mode: str | None, settings: SimSettings, model: PerfModel, run: RateRun,
                    hardware: HardwareInfo, elasticity: float = 1.0) -> tuple[SimSettings, PerfModel]:
    """What `run` is simulated with at its own machine speed: nominal (`mode` None); "mean", the
    rate's two factors (`at_run_speed`); "series", prompts by the compute check's factor and each
    decode worker's steps by its core's interpreter second by second (`decode_speed_of`), or by
    the mean where the run kept no series. The decode steps move `elasticity` times the
    interpreter (in logs: `DecodeSpeed.with_elasticity`)."""
    if mode is None:
        return settings, model
    speed = decode_speed_of(run, hardware) if mode == "series" else None
    if speed is None:
        return settings, at_run_speed(model, run.machine, hardware, elasticity)
    return (replace(settings, decode_speed=speed.with_elasticity(elasticity)),
            model.prompts_slower(run_speed_factors(run.machine, hardware)[0]))


SPEED_TAIL_S = 300.0   # a drawn speed series runs this long past a run's last arrival (its drain)


def with_profile_speed(settings: SimSettings, hardware: HardwareInfo, topology: Topology, run: RateRun,
                       elasticity: float = 1.0) -> SimSettings:
    """`settings` whose decode-side instances step at speeds drawn from the profile's own
    interpreter series (`DecodeSpeed.drawn`: blocks of it, seeded by the rate), what a planner
    could know ahead: not the run's speed, the machine's as the profile saw it move. As they are
    where the profile kept no series."""
    if not hardware.machine_interp_series_ms or hardware.machine_interp_ms <= 0:
        return settings
    length_s = max((r.arrival_s for r in run.requests), default=0.0) + SPEED_TAIL_S
    speed = DecodeSpeed.drawn([series for _, series in hardware.machine_interp_series_ms], hardware.machine_interp_ms,
                              hardware.machine_interp_window_s, topology.num_decode + topology.num_colocated,
                              length_s, settings.spread_seed + round(run.rate_rps * 1000))
    return replace(settings, decode_speed=speed.with_elasticity(elasticity))


def decode_speed_of(run: RateRun, hardware: HardwareInfo) -> DecodeSpeed | None:
    """Each decode worker's speed window by window over `run` (`SimSettings.decode_speed`): its
    core's interpreter loop (`machine["interp_series_ms"]`; the mean of its cores' where it has
    several) over the profile's mean, a window without a sample taken at the series' mean. The
    decode workers are the run's core loads' ("decode-0", ... in name order); None where the run
    kept no series or core loads, or the profile did not sample the interpreter."""
    machine = run.machine or {}
    by_core, profiled = machine.get("interp_series_ms"), hardware.machine_interp_ms
    decoders = sorted((row for row in run.core_loads or () if str(row.get("worker", "")).startswith("decode")),
                      key=lambda row: row["worker"])
    if not by_core or profiled <= 0 or not decoders:
        return None
    by_core = {int(core): values for core, values in by_core.items()}
    series = []
    for row in decoders:
        if not any(int(core) in by_core for core in row["cores"]):
            return None
        means = decode_core_series(by_core, [int(core) for core in row["cores"]])
        known = [ms for ms in means if ms is not None]
        fill = sum(known) / len(known) if known else profiled
        series.append([(ms if ms is not None else fill) / profiled for ms in means])
    return DecodeSpeed.of(series, float(machine.get("interp_window_s", INTERPRETER_WINDOW_S)))


def at_run_speed(model: PerfModel, machine: Mapping[str, Any] | None, hardware: HardwareInfo,
                 elasticity: float = 1.0) -> PerfModel:
    """`model` at a rate's own machine speed (`run_speed_factors`): prompts slower by the compute
    check's factor, decode steps by the interpreter's raised to `elasticity`."""
    prompts, decodes = run_speed_factors(machine, hardware)
    return model.prompts_slower(prompts).decodes_slower(decodes ** elasticity)


def machine_against_profile(machine: Mapping[str, Any], hardware: HardwareInfo) -> str:
    """How the machine at a rate compares with it at the profile (`HardwareInfo`): each check the
    rate has over the profile's (the compute and wake-up checks before the rate against the mean
    of the profile's two; the interpreter's mean over the rate against its mean over the profile),
    or 'the profile did not check' for one the profile lacks, or 'another product' where the rate
    timed another product than the profile."""
    def against(key: str, profiled: float, name: str) -> str:
        if key == "ms_per_product" and machine.get("product", hardware.machine_product) != hardware.machine_product:
            return f"{name}: another product ({machine['product']}) than the profile's ({hardware.machine_product})"
        return f"{name} x{float(machine[key]) / profiled:.2f} of the profile's" if profiled \
            else f"{name}: the profile did not check"

    return ", ".join(against(key, profiled, name)
                     for key, profiled, name in (("ms_per_product", hardware.machine_ms, "compute"),
                                                 ("wake_us", hardware.machine_wake_us, "wake-up"),
                                                 ("interp_ms", hardware.machine_interp_ms, "interpreter"))
                     if key in machine)
