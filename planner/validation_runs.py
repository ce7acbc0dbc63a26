"""The runs behind a measured-vs-simulated validation (`planner.validation` compares them):
the rates to run at, the requests as the client really sent them, the CPU the cluster used, the
comparison of each run with each profile's simulation, and validation.json, which keeps each
rate's requests so a changed simulator or model can be re-checked without the cluster
(`resimulate`). `planner.validation_cluster` runs the real cluster; bench/validate_planner.py
parses the command line and calls both.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loadgen.harness import WorkloadConfig
from loadgen.metrics import SLO
from loadgen.proc_cpu import cpu_seconds, process_tree
from loadgen.workload import RequestSpec
from planner.evaluate import make_attainment_fn
from planner.perf_model import PerfModel, fit_perf_model
from planner.profile import HardwareInfo, Profile, load_profile
from planner.profiler.served_refit import renetted
from planner import router_config
from planner.router_config import router_files, write_router_config
from planner.rate_search import SearchSettings, max_rate
from planner.simulator import RouterSettings, SimResult, SimSettings, Topology, cost_model_from, simulate
from planner.validation_noise import measured_noise
from planner.validation_phases import phase_rows, simulated_phases
from planner.validation import Comparison, plot_validation, to_json
from planner.validation_speed import at_run_speed_as, run_speed_mode, with_profile_speed
from planner.validation_steps import simulated_decode_stretch_by_batch, simulated_prompt_stretch_by_decode_batch
from router.policies.placement import CostModel, PlacementConfig

AUTO_RATE_SHARES = (0.3, 0.6, 0.9, 1.2)  # of the first profile's simulated goodput


@dataclass(frozen=True)
class RateRun:
    """One offered rate of a real run: the requests as sent, loadgen's summary, and the CPU the
    cluster and the client used, in cores (None when not measured), and each request's measured
    phases where the run kept them."""

    rate_rps: float
    requests: list[RequestSpec]
    measured: dict
    cluster_cpu_cores: float | None
    phases: dict[str, list[float]] | None = None  # measured, per request (`planner.validation_phases`)
    # the machine at the rate (`loadgen.host_probe`; None: not checked): just before it, ms per
    # product in the engines' dtype and the cross-core wake-up round trip in us, and (runs since the
    # product was named) which product; over it (runs since the interpreter check), the interpreter
    # loop's mean CPU ms (`InterpreterSampler`) and (runs since the series) each core's second by
    # second from the run's start, `interp_series_ms` (`loadgen.host_probe.interpreter_series`, its
    # window `interp_window_s`, the start `interp_start_s` in monotonic s, the step trace's clock)
    machine: dict[str, Any] | None = None
    # each process group's CPU over the rate, in cores (`cpu_by_process_s`; None: not measured)
    cpu_cores_by_process: dict[str, float] | None = None
    # each worker's cores over the rate (`validation_cpu.core_loads`, as dicts; None: not measured)
    core_loads: list[dict] | None = None


@dataclass(frozen=True)
class ValidationSetup:
    """What a validation.json records besides its runs; `slo` holds for every run."""

    model_name: str
    slo: SLO
    workload: dict[str, Any]
    transport: str
    topology: Topology = Topology.disaggregated(1, 1)
    router: RouterSettings | None = None  # what the real router placed with; None: the simulator's default


def planned_router(profile: Profile, transport: str, topology: Topology, sample: Sequence[RequestSpec]) -> RouterSettings:
    """The router a validation runs, real and simulated alike: the placement policy of `topology`
    (its local prefill cap) and the profile's cost model at the mean lengths of `sample`, fixed
    for every rate (the real router reads its cost model once, at start; the simulator would
    otherwise derive one per request list). No SLOs: nothing is refused on either side."""
    settings = SimSettings.from_profile(profile, transport)
    cost = cost_model_from(fit_perf_model(profile).model, settings, sum(r.prompt_tokens for r in sample) / len(sample),
                           sum(r.output_tokens for r in sample) / len(sample))
    return RouterSettings(placement=settings.router.placement_for(topology), cost=cost, admission=False)


def router_flags_for(router: RouterSettings, directory: Path) -> list[str]:
    """Writes `router`'s policy and cost files into `directory`; the `pdserve router` flags that load them."""
    write_router_config(directory, router.placement, router.cost)
    return router_config.router_flags(directory, SLO())


class NoRateMeetsSlos(ValueError):
    """The profile predicts the SLOs met at no rate for this shape and topology, or at rates so low
    that their runs would outlast `MAX_ARRIVAL_MINUTES`: nothing to measure in a validation's time."""


# Arrivals one shape's auto rates may take: past it the SLOs are too tight for the host (a bench
# model's 3,800-token prompts against TTFT 3 s on a slow VM put the trace's rates at 0.004-0.017
# req/s, 255 minutes of arrivals)
MAX_ARRIVAL_MINUTES = 60.0


def requests_at(rate_rps: float, duration_s: float, min_requests: int) -> int:
    """How many requests a run at `rate_rps` sends: `duration_s` of arrivals, at least `min_requests`."""
    return max(min_requests, round(rate_rps * duration_s))


def arrival_minutes(rates_rps: list[float], duration_s: float, min_requests: int) -> float:
    """Minutes of arrivals the runs at `rates_rps` take (the time a slow rate's `min_requests`
    need included; the engines' drain and the cluster's start come on top)."""
    return sum(requests_at(rate, duration_s, min_requests) / rate for rate in rates_rps) / 60


def auto_rates(profile: Profile, workload: WorkloadConfig, slo: SLO, transport: str, duration_s: float,
               min_requests: int, topology: Topology = Topology.disaggregated(1, 1),
               router: RouterSettings | None = None) -> list[float]:
    """`AUTO_RATE_SHARES` of the simulated goodput of `topology`, for the same run length the real
    runs get (a fixed request count would arrive all at once at high rates and never show the
    overload). Raises NoRateMeetsSlos when the profile meets the SLOs at no rate."""
    fit = fit_perf_model(profile)
    settings = _with_router(SimSettings.from_profile(profile, transport), router)
    attainment = make_attainment_fn(
        lambda rate: workload.build(rate_rps=rate, num_requests=requests_at(rate, duration_s, min_requests)),
        settings, fit.model, slo)
    goodput, _, _ = max_rate(lambda rate: attainment(topology, rate), SearchSettings())
    if goodput <= 0:
        raise NoRateMeetsSlos(f"the first profile meets the SLOs at no rate on {topology.label}; give --rates or "
                              "looser SLOs")
    return rates_within_budget([round(goodput * share, 3) for share in AUTO_RATE_SHARES], duration_s, min_requests,
                               topology.label)


def rates_within_budget(rates_rps: list[float], duration_s: float, min_requests: int, where: str) -> list[float]:
    """`rates_rps` as they are, or NoRateMeetsSlos when their runs would take more than
    `MAX_ARRIVAL_MINUTES` of arrivals (SLOs the host meets only at a trickle). Pure."""
    minutes = arrival_minutes(rates_rps, duration_s, min_requests)
    if minutes > MAX_ARRIVAL_MINUTES:
        goodput = max(rates_rps) / AUTO_RATE_SHARES[-1]
        raise NoRateMeetsSlos(f"the first profile meets the SLOs on {where} only up to {goodput:.3g} req/s: its "
                              f"rates {rates_rps} would take {minutes:.0f} min of arrivals (more than "
                              f"{MAX_ARRIVAL_MINUTES:g}); give --rates or looser SLOs")
    return rates_rps


def _with_router(settings: SimSettings, router: RouterSettings | None) -> SimSettings:
    return settings if router is None else replace(settings, router=router)


def as_sent(specs: list[RequestSpec], records) -> list[RequestSpec]:
    """The requests as the client really sent them (`record.sent_s` by `record.index`): a starved
    client sends late, and the simulator must see the arrivals the cluster saw, not the schedule."""
    sent = {record.index: record.sent_s for record in records}
    return [replace(spec, arrival_s=sent.get(index, spec.arrival_s)) for index, spec in enumerate(specs)]


def cpu_by_process_s(cluster, workers_s: Mapping[str, float] | None = None) -> dict[str, float]:
    """CPU seconds used so far by each group of `cluster`'s processes (a `launch.local.LocalCluster`;
    `validation_cpu.PROCESS_GROUPS`): the router's tree, this process (the client), and each kind of
    worker's trees (vLLM's engine cores and model runners, their polling included: what the OS sees),
    summed from `workers_s` (`cpu_by_worker_s`, read now where not given: one walk of the trees)."""
    groups = {"router": cpu_seconds(process_tree(cluster.router.pid)), "client": time.process_time()}
    for name, seconds in (cpu_by_worker_s(cluster) if workers_s is None else workers_s).items():
        kind = name.split("-")[0]
        groups[kind] = groups.get(kind, 0.0) + seconds
    return groups


def cpu_by_worker_s(cluster) -> dict[str, float]:
    """CPU seconds used so far by each of `cluster`'s workers' process trees, by worker name."""
    return {name: cpu_seconds(process_tree(worker.pid)) for name, worker in cluster.workers.items()}


def worker_cores(cluster) -> dict[str, tuple[int, ...]]:
    """The cores each of `cluster`'s workers is bound to (its process's affinity; Linux), by name;
    a worker that has exited is left out."""
    cores = {}
    for name, worker in cluster.workers.items():
        try:
            cores[name] = tuple(sorted(os.sched_getaffinity(worker.pid)))
        except ProcessLookupError:
            continue
    return cores


def cluster_cpu_s(cluster) -> float:
    """CPU seconds used so far by every process of `cluster` and by this process (the client). Where
    it nears the host's cores the cluster is CPU-bound and the simulator's host model, which counts
    measured work and not polling, is past what it was built on."""
    return sum(cpu_by_process_s(cluster).values())


def compare(runs: Sequence[RateRun], profile_paths: Sequence[Path], transport: str, slo: SLO,
            topology: Topology = Topology.disaggregated(1, 1), router: RouterSettings | None = None,
            what_if: Mapping[str, object] | None = None, note: Callable[[str], None] = print) -> list[Comparison]:
    """Each run against each profile's simulation of its very requests through `topology`, whose
    router places as `router` (the real router's settings); `what_if`: `SimSettings` fields the
    simulation takes instead of its own (`host_window_s`, `router_cpu_charge`, `served_step`,
    `router_core_max_stolen`, `hops`, `client_placement`, `step_spread`, `prompt_stretch`,
    `prompt_loss`, `corun`, `join_warmup`; and `at_run_speed`, not
    the simulator's: each run simulated at its own machine speed, `at_run_speed_as`; or
    `speed_from_profile`, at speeds drawn from the profile's, `with_profile_speed`; either with
    the decode steps moving `speed_elasticity` times the interpreter, default 1); a profile's
    model is named by its file's stem. A `client_placement` other than a profile's nets its served step
    again for it (`with_client_placement`); where it cannot, the profile's own is kept and `note`
    says so."""
    models, asked = {}, dict(what_if or {})
    run_speed = run_speed_mode(asked.pop("at_run_speed", None))
    drawn = asked.pop("speed_from_profile", False)
    elasticity = float(asked.pop("speed_elasticity", 1.0))
    if drawn and run_speed:
        raise ValueError("at_run_speed and speed_from_profile are two answers to one question: ask for one")
    for path in profile_paths:
        profile, overrides = load_profile(path), dict(asked)
        profile, why = with_client_placement(profile, overrides.get("client_placement"))
        if why:
            note(f"{path.stem}: {why}")
            overrides["client_placement"] = None
        models[path.stem] = (_with_router(SimSettings.from_profile(profile, transport, **overrides), router),
                             fit_perf_model(profile).model, profile.hardware)
    def at_speed(settings: SimSettings, model: PerfModel, run: RateRun,
                 hardware: HardwareInfo) -> tuple[SimSettings, PerfModel]:
        if drawn:
            return with_profile_speed(settings, hardware, topology, run, elasticity), model
        return at_run_speed_as(run_speed, settings, model, run, hardware, elasticity)

    comparisons = []
    for run in runs:   # the measured side's noise is the run's alone: once, whatever the profiles
        noise = {} if run.phases is None else measured_noise(run.phases, [r.output_tokens for r in run.requests])
        comparisons += [_comparison(run, name, simulate(run.requests, topology, *at_speed(settings, model, run, hardware)),
                                    slo, noise)
                        for name, (settings, model, hardware) in models.items()]
    return comparisons


def with_client_placement(profile: Profile, placement: str | None) -> tuple[Profile, str]:
    """`profile` with its served step netted again with the client placed as `placement` says
    (`served_refit.renetted`) where that differs from the profile's (`ServingCosts.client_placement`),
    and ""; where it cannot be (no batched runs kept), `profile` as it is and why."""
    if placement is None or placement == profile.serving.client_placement:
        return profile, ""
    try:
        serving = renetted(profile.serving, fit_perf_model(profile).model, placement, profile.decode)
    except ValueError as why:
        return profile, f"{why}: its own placement is kept"
    return replace(profile, serving=serving), ""


def _comparison(run: RateRun, model: str, result: SimResult, slo: SLO, noise: dict) -> Comparison:
    phases = () if run.phases is None else phase_rows(
        run.phases, simulated_phases(result.timeline, result.output_tokens, result.delivery_s))
    return Comparison(run.rate_rps, model, run.measured, result.summary(slo), phases, noise,
                      simulated_prompt_stretch_by_decode_batch(result.prefill_steps),
                      simulated_decode_stretch_by_batch(result.decode_steps))


def load_earlier(path: Path, default_transport: str) -> tuple[ValidationSetup, list[RateRun]]:
    """The setup and runs of an earlier validation.json (its transport, or `default_transport` for
    one written before it was kept). Raises SystemExit when the file holds no requests."""
    earlier = json.loads(path.read_text())
    if "requests" not in earlier:
        raise SystemExit(f"{path} holds no requests (written before they were kept)")
    slo_ms = earlier["slo_ms"]
    router = None  # written before the router was kept: the simulator's default, as then
    if "router" in earlier:
        files = earlier["router"]
        router = RouterSettings(placement=PlacementConfig.from_dict(files[router_config.PLACEMENT_FILE]),
                                cost=CostModel(**files[router_config.COST_FILE]), admission=False)
    setup = ValidationSetup(earlier["model"], SLO(ttft_s=slo_ms["ttft"] / 1e3, tpot_s=slo_ms["tpot"] / 1e3),
                            earlier["workload"], earlier.get("transport", default_transport),
                            Topology.from_label(earlier.get("topology", "1P+1D")), router)
    measured = {run["rate_rps"]: run["measured"] for run in earlier["runs"]}
    cpu_cores, phases = earlier.get("cluster_cpu_cores", {}), earlier.get("measured_phases", {})
    machine, engine_steps = earlier.get("machine", {}), earlier.get("engine_steps", {})
    by_process, by_core = earlier.get("cpu_cores_by_process", {}), earlier.get("core_loads", {})
    runs = [RateRun(float(rate), [RequestSpec(*row) for row in rows],
                    measured[float(rate)] | ({"engine_steps": engine_steps[rate]} if rate in engine_steps else {}),
                    cpu_cores.get(rate), _phases_from_json(phases.get(rate)), machine.get(rate),
                    by_process.get(rate), by_core.get(rate))
            for rate, rows in earlier["requests"].items()]
    return setup, runs


def _phases_to_json(phases: dict[str, list[float]]) -> dict[str, list[float | None]]:
    """Seconds rounded to microseconds, NaN as null (JSON has no NaN)."""
    return {phase: [None if math.isnan(v) else round(v, 6) for v in values] for phase, values in phases.items()}


def _phases_from_json(data: dict | None) -> dict[str, list[float]] | None:
    if not data:
        return None
    return {phase: [math.nan if v is None else float(v) for v in values] for phase, values in data.items()}


REPO = Path(__file__).resolve().parents[1]


def recorded_path(path: Path) -> str:
    """`path` as a kept result records it: relative to the repository where it lies inside it (a
    clone elsewhere reads the same file), else as given."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def write_validation(out_dir: Path, setup: ValidationSetup, profile_paths: Sequence[Path], runs: Sequence[RateRun],
                     comparisons: Sequence[Comparison], resimulated: Path | None = None,
                     what_if: Mapping[str, object] | None = None) -> tuple[Path, Path]:
    """Writes <out_dir>/validation.json (the setup, the comparisons, each run's CPU and requests as
    [arrival_s, prompt_tokens, output_tokens], its traced engine steps and the simulator's `what_if`
    settings where there are any) and validation.png; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slo = setup.slo
    json_path = out_dir / "validation.json"
    json_path.write_text(json.dumps(
        {"model": setup.model_name, "profiles": [recorded_path(p) for p in profile_paths], "slo_ms": slo.as_ms(),
         "workload": setup.workload, "transport": setup.transport, "topology": setup.topology.label,
         **({"router": router_files(setup.router.placement, setup.router.cost)} if setup.router else {}),
         **({"resimulated": recorded_path(resimulated)} if resimulated else {}),
         **({"sim_what_if": dict(what_if)} if what_if else {}),
         **to_json(comparisons),
         "cluster_cpu_cores": {str(run.rate_rps): run.cluster_cpu_cores for run in runs},
         "machine": {str(run.rate_rps): run.machine for run in runs if run.machine},
         "cpu_cores_by_process": {str(run.rate_rps): run.cpu_cores_by_process for run in runs
                                  if run.cpu_cores_by_process},
         "core_loads": {str(run.rate_rps): run.core_loads for run in runs if run.core_loads},
         "requests": {str(run.rate_rps): [[round(r.arrival_s, 6), r.prompt_tokens, r.output_tokens]
                                          for r in run.requests] for run in runs},
         "measured_phases": {str(run.rate_rps): _phases_to_json(run.phases) for run in runs if run.phases},
         **_engine_steps(runs)},
        indent=1))
    png = plot_validation(comparisons, out_dir / "validation.png",
                          f"{setup.model_name} {setup.topology.label}: measured vs simulated (TTFT<={slo.ttft_s * 1e3:g} ms, "
                          f"TPOT<={slo.tpot_s * 1e3:g} ms)")
    return json_path, png


def _engine_steps(runs: Sequence[RateRun]) -> dict:
    """The traced engine steps of the runs that kept them (`bench/validate_planner.py --step-trace`)."""
    kept = {str(run.rate_rps): run.measured["engine_steps"] for run in runs if "engine_steps" in run.measured}
    return {"engine_steps": kept} if kept else {}
