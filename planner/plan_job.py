"""`pdserve plan`'s work: fit the profile, search with the simulator, print, plot, write JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loadgen.metrics import SLO
from loadgen.workload import RequestSpec
from pdserve.roles import TOPOLOGIES
from pdserve.roles import Topology as TopologyKind
from planner import report
from planner.evaluate import WorkloadAt, make_attainment_fn, with_router_slo
from planner.perf_model import FitReport
from planner.router_config import up_flags, write_planned_cluster, write_router_config
from planner.rate_search import SearchSettings
from planner.search import (DEFAULT_LOCAL_PREFILL_CAPS, DEFAULT_TOKEN_BUDGETS, RateSearch, SplitSearch,
                            enumerate_topologies, fewest_devices, search_splits)
from planner.simulator import SimSettings, Topology, cost_model_from, simulate
from planner.speed_margin import SpeedMargin
from planner.sustained import prefill_load


@dataclass(frozen=True)
class PlanInputs:
    fit: FitReport
    settings: SimSettings
    workload_at: WorkloadAt
    workload_label: str
    slo: SLO
    search: SearchSettings
    budget_devices: int
    output_dir: Path
    label: str
    show_progress: bool = True
    kinds: tuple[TopologyKind, ...] = TOPOLOGIES
    local_prefill_caps: tuple[int, ...] = DEFAULT_LOCAL_PREFILL_CAPS
    token_budgets: tuple[int, ...] = DEFAULT_TOKEN_BUDGETS  # aggregated and hybrid: engine step budgets tried
    router_config_dir: Path | None = None  # --write-router-config: where the picked cluster's router files go
    objective: str = "per-device"  # the pick: highest goodput per device, or "total" within the budget
    # the robust pick: rank by the goodput on a machine this much slower than profiled (0.1: 10%); 0: nominal
    speed_margin: SpeedMargin = SpeedMargin(0.0, "none asked")

    @property
    def include_colocated(self) -> bool:
        return "aggregated" in self.kinds


def with_router_cost(settings: SimSettings, fit: FitReport, workload_at: WorkloadAt,
                     devices_per_instance: int = 1) -> SimSettings:
    """`settings` whose simulated router places with the cost model of this profile and workload
    (the one `--write-router-config` writes) for engines over `devices_per_instance` devices,
    fixed once for every simulation of the search."""
    sample = workload_at(1.0)
    prompt = sum(r.prompt_tokens for r in sample) / len(sample)
    output = sum(r.output_tokens for r in sample) / len(sample)
    cost = cost_model_from(fit.model.on_devices(devices_per_instance), settings, prompt, output)
    return replace(settings, router=replace(settings.router, cost=cost))


def _progress(show: bool, total: int | None) -> Progress:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[last]}"), TimeElapsedColumn())
    return Progress(*columns, disable=not show, transient=False)


def _print_header(console: Console, inputs: PlanInputs) -> None:
    console.print("[bold]performance model[/bold] (fitted to the profile)")
    for line in inputs.fit.lines():
        console.print("  " + line, markup=False)
    s = inputs.settings
    console.print(f"[bold]engine[/bold] token budget {s.token_budget}, max seqs {s.max_num_seqs}, "
                  f"{s.num_kv_blocks} KV blocks of {s.block_size} tokens per instance, transport {s.transport}")
    console.print(f"[bold]workload[/bold] {inputs.workload_label}; SLOs TTFT <= {inputs.slo.ttft_s * 1e3:g} ms, "
                  f"TPOT <= {inputs.slo.tpot_s * 1e3:g} ms for >= {inputs.search.target_attainment:.0%} of requests")
    if not s.router.calibrated:
        console.print("[bold]admission[/bold] uncalibrated: the simulated router judges the cost model's predictions "
                      "as they are, where a live router scales them by what it observed (a what-if)")
    for note in beyond_the_profile(inputs):
        console.print(f"[yellow]outside the profile:[/yellow] {note}: predictions there are extrapolated; "
                      f"profile with a larger --max-model-len / --max-num-seqs to measure them", highlight=False)


def beyond_the_profile(inputs: PlanInputs) -> list[str]:
    """Where the workload (a sample at 1 req/s) and the engine's batch cap ask the model past what
    its profile measured."""
    if inputs.fit.measured is None:
        return []
    sample = inputs.workload_at(1.0)
    return inputs.fit.measured.beyond(max(r.prompt_tokens for r in sample),
                                      max(r.prompt_tokens + r.output_tokens for r in sample),
                                      inputs.settings.max_num_seqs)


def _operating_points(inputs: PlanInputs, picks: Sequence[RateSearch | None]) -> dict[str, dict]:
    """label -> the simulated summary at each pick's goodput rate, with its `prefill_load`."""
    rows = {}
    for pick in picks:
        if pick is not None and pick.max_rate_rps > 0:
            requests = inputs.workload_at(pick.max_rate_rps)
            result = simulate(requests, pick.topology, with_router_slo(inputs.settings, inputs.slo), inputs.fit.model)
            load = prefill_load(requests, pick.topology, inputs.fit.model,
                                inputs.settings.for_topology(pick.topology).token_budget)
            rows[f"{pick.topology.label} @ {pick.max_rate_rps:.2f}"] = result.summary(inputs.slo) | {"prefill_load": load}
    return rows


def _print_burst_only(console: Console, points: dict[str, dict], num_requests: int) -> None:
    """A warning for each operating point whose prompts alone outrun its prefilling engines."""
    for label, summary in points.items():
        if summary["prefill_load"] > 1:
            console.print(f"[yellow]not sustained:[/yellow] {label} req/s: its prompts alone need "
                          f"{summary['prefill_load']:.0%} of its prefilling engines' time while they arrive; "
                          f"the SLOs hold for these {num_requests} requests only while a queue grows (plan with "
                          "more --num-prompts for a rate that lasts)", highlight=False)


def describe(topology: Topology) -> str:
    """The topology in words, for the recommendation."""
    budget = f", {topology.token_budget}-token engine steps" if topology.token_budget else ""
    if topology.kind == "aggregated":
        width = topology.devices_per_instance
        each = f"each over {width} devices, " if width > 1 else "each "
        workers = "1 aggregated worker" if topology.num_colocated == 1 else f"{topology.num_colocated} aggregated workers"
        return f"{workers} ({each}serving both phases{budget})"
    pools = f"{topology.num_prefill} prefill + {topology.num_decode} decode"
    if topology.kind == "disaggregated":
        return f"{pools} (disaggregated{budget})"
    cap = topology.local_prefill_max_tokens
    return f"{pools}, hybrid (decode workers may prefill locally{f' prompts up to {cap} tokens' if cap else ''}{budget})"


def _print_picks(console: Console, result: SplitSearch) -> None:
    """Each kind's best per device with its goodput, then the pick."""
    for kind, best in result.best_by_kind().items():
        if best is None:
            console.print(f"{kind}: no topology within the budget meets the SLOs at any rate")
            continue
        console.print(f"{kind}: best {best.topology.label}: {best.max_rate_rps:.3f} req/s "
                      f"({best.goodput_per_device:.3f} req/s per device) at {best.attainment:.1%} attainment")
    best = result.best
    if best is None:
        console.print("[red]no topology within the budget meets the SLOs at any rate[/red]")
        return
    total = result.objective == "total"
    measure = (lambda r: r.max_rate_rps) if total else (lambda r: r.goodput_per_device)  # noqa: E731
    others = [f"{measure(best) / measure(other):.2f}x the best {kind}"
              for kind, other in result.best_by_kind().items() if other is not None and kind != best.topology.kind]
    console.print(f"[bold green]recommended:[/bold green] {describe(best.topology)}: {best.max_rate_rps:.3f} req/s "
                  f"({best.goodput_per_device:.3f} req/s per device) at {best.attainment:.1%} attainment"
                  + (f"; {'in all' if total else 'per device'} {', '.join(others)}" if others else ""))


def _write_router_config(inputs: PlanInputs, best: RateSearch, console: Console) -> None:
    settings = inputs.settings.for_topology(best.topology)  # the cost model of the pick's token budget
    cost = settings.router.cost or with_router_cost(settings, inputs.fit, inputs.workload_at,
                                                     best.topology.devices_per_instance).router.cost
    paths = write_router_config(inputs.router_config_dir, settings.router.placement_for(best.topology), cost)
    paths.append(write_planned_cluster(inputs.router_config_dir, best.topology, inputs.slo, best.max_rate_rps,
                                       best.attainment, inputs.objective, inputs.workload_label,
                                       inputs.settings.router.calibrated))
    console.print(f"wrote {', '.join(map(str, paths))}; run the cluster with:", highlight=False)
    one = inputs.settings
    kv_mb_per_device = one.num_kv_blocks * one.block_size * one.kv_bytes_per_token >> 20
    flags = up_flags(best.topology, inputs.router_config_dir, inputs.slo, kv_mb_per_device)
    console.print("  pdserve up --model MODEL_DIR " + " ".join(flags), markup=False, highlight=False,
                  soft_wrap=True)  # one line, to copy


def run_goodput_search(inputs: PlanInputs, console: Console) -> int:
    _print_header(console, inputs)
    console.print(f"[bold]speed margin[/bold] {inputs.speed_margin.value:.0%} ({inputs.speed_margin.why})",
                  highlight=False)
    attainment = make_attainment_fn(inputs.workload_at, inputs.settings, inputs.fit.model, inputs.slo)
    margin = inputs.speed_margin.value
    robust = (make_attainment_fn(inputs.workload_at, inputs.settings, inputs.fit.model.slower(1 + margin), inputs.slo)
              if margin > 0 else None)
    widths = inputs.fit.model.widths
    total = len(enumerate_topologies(inputs.budget_devices, inputs.kinds, inputs.local_prefill_caps,
                                     inputs.token_budgets, widths))
    started = time.perf_counter()
    with _progress(inputs.show_progress, total) as progress:
        task = progress.add_task("searching topologies", total=total, last="")
        result = search_splits(attainment, inputs.budget_devices, inputs.search, kinds=inputs.kinds,
                               local_prefill_caps=inputs.local_prefill_caps, objective=inputs.objective,
                               token_budgets=inputs.token_budgets, widths=widths, robust_attainment=robust,
                               progress=lambda label: progress.update(task, advance=1, last=label))
    elapsed = time.perf_counter() - started
    console.print(report.search_table(result, inputs.search.target_attainment, margin))
    _print_picks(console, result)
    points = _operating_points(inputs, list(result.best_by_kind().values()))
    console.print(report.detail_table("simulated latency at the goodput rate", points))
    _print_burst_only(console, points, len(inputs.workload_at(1.0)))
    slo = inputs.slo
    title = f"{inputs.label}: {inputs.workload_label}; TTFT<={slo.ttft_s * 1e3:g} ms, TPOT<={slo.tpot_s * 1e3:g} ms"
    png = report.plot_search(result, inputs.search.target_attainment,
                             inputs.output_dir / f"{inputs.label}_search.png", title)
    out = inputs.output_dir / f"{inputs.label}_search.json"
    out.write_text(json.dumps({"workload": inputs.workload_label, "slo": inputs.slo.as_ms(),
                               "target_attainment": inputs.search.target_attainment,
                               "speed_margin": margin, "speed_margin_why": inputs.speed_margin.why,
                               "budget_devices": inputs.budget_devices, "search_s": elapsed,
                               "calibrated_admission": inputs.settings.router.calibrated,
                               **report.search_json(result),
                               "prefill_load_at_goodput": {label: round(summary["prefill_load"], 4)
                                                           for label, summary in points.items()}}, indent=1))
    console.print(f"search took {elapsed:.1f} s; wrote {png} and {out}")
    if inputs.router_config_dir is not None and result.best is not None:
        _write_router_config(inputs, result.best, console)
    return 0 if result.best is not None else 1


def run_fewest_devices(inputs: PlanInputs, rate_rps: float, max_devices: int, console: Console) -> int:
    _print_header(console, inputs)
    base = make_attainment_fn(inputs.workload_at, inputs.settings, inputs.fit.model, inputs.slo)
    checked: list[tuple[str, float]] = []

    def attainment(topology: Topology, rate: float) -> float:
        value = base(topology, rate)
        checked.append((topology.label, value))
        return value

    with _progress(inputs.show_progress, None) as progress:
        task = progress.add_task(f"topologies tried at {rate_rps:g} req/s", total=None, last="")
        answer = fewest_devices(attainment, rate_rps, max_devices, inputs.search, inputs.kinds,
                                inputs.local_prefill_caps, inputs.token_budgets, inputs.fit.model.widths,
                                progress=lambda label: progress.update(task, advance=1, last=label))
    console.print(report.fewest_table(answer, inputs.search.target_attainment))
    picks = [RateSearch(found[0], rate_rps, found[1], ()) for _, found in answer.by_kind if found is not None]
    points = _operating_points(inputs, picks)
    console.print(report.detail_table(f"simulated latency at {rate_rps:g} req/s", points))
    _print_burst_only(console, points, len(inputs.workload_at(1.0)))
    png = report.plot_fewest(checked, answer, inputs.search.target_attainment,
                             inputs.output_dir / f"{inputs.label}_fewest_devices.png")
    console.print(f"wrote {png}")
    return 0 if answer.best is not None else 1


def workload_label(requests: Callable[[float], Sequence[RequestSpec]], kind: str, rate_for_stats: float = 1.0) -> str:
    sample = requests(rate_for_stats)
    prompt = sum(r.prompt_tokens for r in sample) / len(sample)
    output = sum(r.output_tokens for r in sample) / len(sample)
    return f"{kind}, {len(sample)} requests, mean {prompt:.0f} prompt / {output:.0f} output tokens"
