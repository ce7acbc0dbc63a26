"""`pdserve plan`'s work: fit the profile, search with the simulator, print, plot, write JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loadgen.metrics import SLO
from loadgen.workload import RequestSpec
from planner import report
from planner.evaluate import WorkloadAt, make_attainment_fn
from planner.perf_model import FitReport
from planner.search import RateSearch, SearchSettings, enumerate_splits, fewest_devices, search_splits
from planner.simulator import SimSettings, Topology, simulate


@dataclass(frozen=True)
class PlanInputs:
    fit: FitReport
    settings: SimSettings
    workload_at: WorkloadAt
    workload_label: str
    slo: SLO
    search: SearchSettings
    budget_devices: int
    include_colocated: bool
    output_dir: Path
    label: str
    show_progress: bool = True


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


def _operating_points(inputs: PlanInputs, picks: Sequence[RateSearch | None]) -> dict[str, dict]:
    rows = {}
    for pick in picks:
        if pick is not None and pick.max_rate_rps > 0:
            result = simulate(inputs.workload_at(pick.max_rate_rps), pick.topology, inputs.settings,
                              inputs.fit.model)
            rows[f"{pick.topology.label} @ {pick.max_rate_rps:.2f}"] = result.summary(inputs.slo)
    return rows


def run_goodput_search(inputs: PlanInputs, console: Console) -> int:
    _print_header(console, inputs)
    attainment = make_attainment_fn(inputs.workload_at, inputs.settings, inputs.fit.model, inputs.slo)
    total = len(enumerate_splits(inputs.budget_devices)) + (inputs.budget_devices if inputs.include_colocated else 0)
    started = time.perf_counter()
    with _progress(inputs.show_progress, total) as progress:
        task = progress.add_task("searching topologies", total=total, last="")
        result = search_splits(attainment, inputs.budget_devices, inputs.search, inputs.include_colocated,
                               progress=lambda label: progress.update(task, advance=1, last=label))
    elapsed = time.perf_counter() - started
    console.print(report.search_table(result, inputs.search.target_attainment))
    best, colocated = result.best, result.best_colocated
    if best is None:
        console.print("[red]no disaggregated split within the budget meets the SLOs at any rate[/red]")
    else:
        console.print(f"[bold green]recommended:[/bold green] {best.topology.num_prefill} prefill + "
                      f"{best.topology.num_decode} decode: {best.max_rate_rps:.3f} req/s "
                      f"({best.goodput_per_device:.3f} req/s per device) at {best.attainment:.1%} attainment")
    if colocated is not None:
        ratio = (f"; disaggregated/colocated per device: {best.goodput_per_device / colocated.goodput_per_device:.2f}x"
                 if best else "")
        console.print(f"colocated alternative: {colocated.topology.num_colocated} vLLM instances: "
                      f"{colocated.max_rate_rps:.3f} req/s ({colocated.goodput_per_device:.3f} per device{ratio})")
    points = _operating_points(inputs, (best, colocated))
    console.print(report.detail_table("simulated latency at the goodput rate", points))
    slo = inputs.slo
    title = f"{inputs.label}: {inputs.workload_label}; TTFT<={slo.ttft_s * 1e3:g} ms, TPOT<={slo.tpot_s * 1e3:g} ms"
    png = report.plot_search(result, inputs.search.target_attainment,
                             inputs.output_dir / f"{inputs.label}_search.png", title)
    out = inputs.output_dir / f"{inputs.label}_search.json"
    out.write_text(json.dumps({"workload": inputs.workload_label, "slo": inputs.slo.as_ms(),
                               "target_attainment": inputs.search.target_attainment,
                               "budget_devices": inputs.budget_devices, "search_s": elapsed,
                               **report.search_json(result)}, indent=1))
    console.print(f"search took {elapsed:.1f} s; wrote {png} and {out}")
    return 0 if best is not None or colocated is not None else 1


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
        answer = fewest_devices(attainment, rate_rps, max_devices, inputs.search, inputs.include_colocated,
                                progress=lambda label: progress.update(task, advance=1, last=label))
    console.print(report.fewest_table(answer, inputs.search.target_attainment))
    found = [pick for pick in (answer.disaggregated, answer.colocated) if pick is not None]
    picks = [RateSearch(topology, rate_rps, value, ()) for topology, value in found]
    console.print(report.detail_table(f"simulated latency at {rate_rps:g} req/s", _operating_points(inputs, picks)))
    png = report.plot_fewest(checked, answer, inputs.search.target_attainment,
                             inputs.output_dir / f"{inputs.label}_fewest_devices.png")
    console.print(f"wrote {png}")
    return 0 if answer.disaggregated is not None or answer.colocated is not None else 1


def workload_label(requests: Callable[[float], Sequence[RequestSpec]], kind: str, rate_for_stats: float = 1.0) -> str:
    sample = requests(rate_for_stats)
    prompt = sum(r.prompt_tokens for r in sample) / len(sample)
    output = sum(r.output_tokens for r in sample) / len(sample)
    return f"{kind}, {len(sample)} requests, mean {prompt:.0f} prompt / {output:.0f} output tokens"
