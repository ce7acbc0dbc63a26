"""One workload shape on one topology's real cluster, rate after rate: the I/O half of a
measured-vs-simulated validation (bench/validate_planner.py parses the command line and compares;
`planner.validation_runs` holds the runs' plain values, the rates and the comparison).

The cluster runs on cores 0 and 1 with the first profile's engine settings and the router placing as
the simulated router will (`ValidationSetup.router`). Before each rate the machine is checked (a
product in the profile's dtype on every core, a cross-core wake-up round trip); over it a fixed
Python loop is timed on every core (`loadgen.host_probe.InterpreterSampler`) and the CPU is read by
process and by core; with a step trace each rate prints what the decode worker's gap was made of
(`planner.validation_step_report`). After the rates, up to `ClusterPlan.refine` more bracket the knee
and halve the bracket (`loadgen.sweep.next_bracketing_rate`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from loadgen.harness import run_with_progress
from loadgen.host_probe import (INTERPRETER_WINDOW_S, InterpreterSampler, interpreter_series, speed_check_ms,
                                wake_check_us)
from loadgen.metrics import summarize
from loadgen.proc_cpu import core_busy_s
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig
from loadgen.sweep import next_bracketing_rate
from pdserve.engine_step_trace import STEP_TRACE_ENV
from planner.profile import Profile
from planner.validation_cpu import check_line, core_line, core_loads, traffic_of, unbound_cpu_check
from planner.validation_phases import measured_local_share, measured_phases
from planner.validation_runs import (RateRun, ValidationSetup, arrival_minutes, as_sent, auto_rates, cpu_by_process_s,
                                     cpu_by_worker_s, requests_at, router_flags_for, worker_cores)
from planner.validation_shapes import Shape
from planner.validation_speed import InterpreterSeries, machine_against_profile
from planner.validation_step_report import step_report

WARMUP_REQUESTS = 4   # each rate's first requests, sent before its arrivals are timed


@dataclass(frozen=True)
class ClusterPlan:
    """How each shape runs on the cluster: the model served, each rate's arrivals (`duration_s` of
    them, at least `min_requests`), the rates (() : 30-120% of the first profile's simulated goodput,
    `auto_rates`), how many more rates bracket the knee, and whether the engines trace their steps."""

    model: Path
    duration_s: float
    min_requests: int
    seed: int = 0
    refine: int = 2
    step_trace: bool = False
    rates_rps: tuple[float, ...] = ()


def run_shape(plan: ClusterPlan, first: Profile, profile_names: Sequence[str], shape: Shape, setup: ValidationSetup,
              max_model_len: int, out_dir: Path, console: Console) -> list[RateRun]:
    """Runs `shape` on `setup.topology`'s real cluster at each rate, then up to `plan.refine` more
    around the knee; the runs by rising rate. Raises `NoRateMeetsSlos` (from `auto_rates`) where the
    first profile meets the SLOs at no rate. Logs and step traces go under `out_dir`/logs."""
    slo = setup.slo
    rates = list(plan.rates_rps) or auto_rates(first, shape.workload, slo, setup.transport, plan.duration_s,
                                               plan.min_requests, setup.topology, setup.router)
    console.print(f"rates {rates} req/s ({arrival_minutes(rates, plan.duration_s, plan.min_requests):.1f} min of "
                  f"arrivals); SLOs TTFT {slo.ttft_s * 1e3:g} ms, TPOT {slo.tpot_s * 1e3:g} ms; "
                  f"profiles {list(profile_names)}" + (f"; then up to {plan.refine} more to bracket "
                                                       "the knee and halve the bracket" if plan.refine else ""))
    trace_dir = out_dir / "logs" / "steps"
    if plan.step_trace:   # the workers and their engine cores inherit it as they start
        os.environ[STEP_TRACE_ENV] = str(trace_dir)
    try:
        system = start_cluster(plan.model, first, setup, max_model_len, out_dir / "logs")
    finally:
        os.environ.pop(STEP_TRACE_ENV, None)
    try:
        rated = RatedCluster(system, plan, first, shape, setup, trace_dir if plan.step_trace else None, console)
        runs = [rated.run(index, rate) for index, rate in enumerate(rates)]
        for _ in range(plan.refine):   # bracket the goodput, then halve the bracket it is interpolated across
            curve = [(run.rate_rps, run.measured["slo_attainment"]) for run in runs]
            if (rate := next_bracketing_rate(curve)) is None:
                break
            where = ("above every rate, which all met the SLOs" if rate > max(curve)[0]
                     else "below every rate, which all missed the SLOs" if rate < min(curve)[0]
                     else "between the last rate that met the SLOs and the first that did not")
            console.print(f"refining the knee: {rate:g} req/s, {where}")
            runs.append(rated.run(len(runs), rate))
    finally:
        system.stop()
    return sorted(runs, key=lambda run: run.rate_rps)


def start_cluster(model: Path, profile: Profile, setup: ValidationSetup, max_model_len: int, log_dir: Path):
    """The topology on cores 0 and 1 (`Topology.devices_per_instance` cores per worker), its router
    placing with `setup.router`, started."""
    from launch.comparison_systems import PdserveCluster
    from pdserve.engine import EngineSettings

    # No prefix cache: the simulator computes every prompt, so the real engines must too.
    engine = EngineSettings(model=str(model), dtype=profile.model.dtype, block_size=profile.model.block_size,
                            kv_cache_bytes=profile.engine.kv_cache_memory_bytes, max_num_seqs=profile.engine.max_num_seqs,
                            max_model_len=max_model_len, enable_prefix_caching=False,
                            max_num_batched_tokens=setup.topology.token_budget or profile.engine.max_num_batched_tokens)
    topology = setup.topology
    flags = tuple(router_flags_for(setup.router, log_dir / "router"))
    cluster = PdserveCluster.sized(engine, "0", "1", log_dir, setup.transport, topology.label, topology.kind,
                                   topology.num_prefill, topology.num_decode + topology.num_colocated, flags,
                                   topology.devices_per_instance)
    cluster.start()
    return cluster


class RatedCluster:
    """A started cluster that one shape runs on at one rate after another (`run`)."""

    def __init__(self, system, plan: ClusterPlan, first: Profile, shape: Shape, setup: ValidationSetup,
                 trace_dir: Path | None, console: Console):
        self._system, self._plan, self._first, self._shape = system, plan, first, shape
        self._setup, self._trace_dir, self._console = setup, trace_dir, console
        self._vocab_size = model_config(plan.model)["vocab_size"]

    def run(self, index: int, rate: float) -> RateRun:
        """The shape's requests at `rate` (the `index`th rate: its prompts' seed), measured: the
        requests as sent, the summary, the CPU by process and core, the machine before and over it."""
        plan, first, system, console = self._plan, self._first, self._system, self._console
        specs = self._shape.workload.build(rate_rps=rate, num_requests=requests_at(rate, plan.duration_s,
                                                                                   plan.min_requests))
        prompts = PromptSynthesizer(seed=plan.seed + index, token_id_high=min(250, self._vocab_size))
        machine = machine_now(first)
        workers_before, cores_before = cpu_by_worker_s(system.cluster), core_busy_s()
        cpu_before, wall_before = cpu_by_process_s(system.cluster, workers_before), time.perf_counter()
        with InterpreterSampler(sorted(os.sched_getaffinity(0))) as interpreter:
            result = asyncio.run(run_with_progress(system.target(), specs, prompts,
                                                   RunConfig(warmup_requests=WARMUP_REQUESTS),
                                                   f"{self._setup.topology.label} {self._shape.name} {rate:g} req/s"))
        series = interpreter_series(interpreter.samples, result.start_s, result.start_s + result.duration_s)
        machine |= {"interp_ms": round(interpreter.mean_ms, 4),
                    "interp_series_ms": {str(core): values for core, values in series.items()},
                    "interp_window_s": INTERPRETER_WINDOW_S, "interp_start_s": round(result.start_s, 4)}
        wall_s = time.perf_counter() - wall_before
        workers_after = cpu_by_worker_s(system.cluster)
        by_process = {group: round(cores, 4) for group, cores in cores_since(
            cpu_before, cpu_by_process_s(system.cluster, workers_after), wall_s).items()}
        cpu_cores = sum(by_process.values())
        loads = core_loads(cores_since(cores_before, core_busy_s(), wall_s), worker_cores(system.cluster),
                           cores_since(workers_before, workers_after, wall_s))
        summary = summarize(result.records, result.duration_s, self._setup.slo)
        if (local := measured_local_share(result.records)) is not None:
            summary["local_prefill_share"] = local
        if self._trace_dir is not None:
            summary["engine_steps"] = step_report(
                system.cluster, self._trace_dir, result, first, console,
                self._setup.topology.token_budget or first.engine.max_num_batched_tokens,
                InterpreterSeries(series, result.start_s, INTERPRETER_WINDOW_S, worker_cores(system.cluster)))
        traffic = traffic_of(result.records, wall_s, summary.get("engine_steps"))
        console.print(check_line(rate, unbound_cpu_check(by_process, first.serving, traffic)), markup=False)
        if loads:
            console.print(core_line(rate, loads), markup=False)
        console.print(f"{rate:g} req/s: the cluster's processes and this client used "
                      f"{cpu_cores:.2f} of the host's {len(os.sched_getaffinity(0))} cores; before it "
                      f"{machine['ms_per_product']:.2f} ms per {first.hardware.machine_product} product "
                      f"and a {machine['wake_us']:.0f} us wake-up round trip, over it "
                      f"{machine['interp_ms']:.3f} ms of CPU an interpreter loop "
                      f"({machine_against_profile(machine, first.hardware)})")
        if summary["failed"]:
            console.print(f"[red]{summary['failed']} requests failed at {rate:g} req/s: "
                          f"{summary['errors_by_kind']}[/red]")
        return RateRun(rate, as_sent(specs, result.records), summary, cpu_cores,
                       measured_phases(result.records, len(specs)), machine, by_process,
                       [dataclasses.asdict(row) | {"others": round(row.others, 4)} for row in loads] or None)


def cores_since(before: dict, after: dict, wall_s: float) -> dict:
    """Each key's CPU seconds from `before` to `after` over `wall_s`, in cores (a key new in `after`
    counts from 0). Pure."""
    return {key: (used - before.get(key, 0.0)) / wall_s for key, used in after.items()}


def machine_now(profile: Profile) -> dict[str, Any]:
    """The machine's compute speed (the profile's product, named) and wake-up round trip, every
    core, now."""
    cores = sorted(os.sched_getaffinity(0))
    return {"ms_per_product": speed_check_ms(cores, product=profile.hardware.machine_product),
            "product": profile.hardware.machine_product, "wake_us": wake_check_us(cores)}


def model_config(model: Path) -> dict:
    """The checkpoint's config.json."""
    return json.loads((model / "config.json").read_text())
