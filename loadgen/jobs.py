"""The two jobs behind `pdserve load`: one measured run, and the goodput sweep. Each prints rich
tables and writes a JSON file and PNG plots under `OutputConfig.directory`; a sweep that stops on
an error still writes what it measured before reporting the error."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen.harness import SweepOutcome, WorkloadConfig, run_sweep, run_with_progress
from loadgen.metrics import SLO, summarize
from loadgen.plots import plot_attainment, plot_latency_cdfs
from loadgen.prompts import PromptSynthesizer
from loadgen.report import print_summary, result_json, write_json
from loadgen.runner import RequestRecord, RunConfig
from loadgen.sweep import SearchConfig
from loadgen.targets.base import Target, TargetError


@dataclass(frozen=True)
class OutputConfig:
    directory: Path
    label: str
    show_progress: bool = True

    def path(self, suffix: str) -> Path:
        return self.directory / f"{self.label}{suffix}"


def burstiness(workload: WorkloadConfig, run_config: RunConfig) -> float | str | None:
    """vLLM's `burstiness`, the gamma shape of the arrival gaps: 1.0 for Poisson, 1/cv^2 for gamma,
    "inf" for constant gaps (vLLM's limit for evenly spaced arrivals, written as a string as vLLM
    writes an infinite request_rate, so the file stays strict JSON); None where the gaps are not
    gamma at all: trace timestamps, and concurrency mode (arrival times unused)."""
    if run_config.mode == "concurrency" or workload.arrival == "trace":
        return None
    return {"poisson": 1.0, "gamma": 1.0 / workload.cv**2, "constant": "inf"}[workload.arrival]


def _metadata(workload: WorkloadConfig, run_config: RunConfig, slo: SLO, prompts: PromptSynthesizer,
              rate_rps: float | None) -> dict[str, Any]:
    """vLLM's setup keys where they apply (request_rate "inf": all at once or a closed loop; None:
    the trace's own timestamps), plus this tool's workload description."""
    unlimited = run_config.mode == "concurrency" or (rate_rps is not None and not math.isfinite(rate_rps))
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "tokenizer_id": prompts.tokenizer_id,
        "request_rate": "inf" if unlimited else rate_rps,
        "burstiness": burstiness(workload, run_config),
        "workload": workload.kind,
        "arrival": workload.arrival,
        "seed": workload.seed,
        "goodput": slo.as_ms() or None,
    }


def load_job(make: Callable[[], Target], workload: WorkloadConfig, run_config: RunConfig, slo: SLO,
             prompts: PromptSynthesizer, output: OutputConfig) -> int:
    """One run: 0 when at least one request completed, 1 otherwise (the reasons are printed)."""
    console = Console()
    specs = workload.build()
    target = make()
    try:
        result = asyncio.run(run_with_progress(target, specs, prompts, run_config, output.label,
                                               output.show_progress, console))
    except (TargetError, OSError) as unreachable:
        console.print(f"[red]could not start the run: {unreachable}")
        return 1
    summary = summarize(result.records, result.duration_s, slo)
    print_summary(summary, console, title=f"{output.label}: {result.backend}")
    _print_warmup(console, result.warmup)
    metadata = {"label": output.label, "model_id": getattr(target, "model", None),
                **_metadata(workload, run_config, slo, prompts, workload.rate_rps)}
    json_path = write_json(output.path(".json"), result_json(result, summary, metadata))
    png_path = plot_latency_cdfs({output.label: result.records}, output.path("_latency_cdf.png"), slo)
    console.print(f"wrote {json_path} and {png_path}")
    return 0 if summary["completed"] else 1


def _print_warmup(console: Console, warmup: tuple[RequestRecord, ...]) -> None:
    failed = [r for r in warmup if not r.ok]
    if failed:
        console.print(f"[yellow]warm-up: {len(failed)} of {len(warmup)} requests failed (not counted above), "
                      f"first error: {failed[0].error}")


def sweep_job(make: Callable[[], Target], workload: WorkloadConfig, run_config: RunConfig, slo: SLO,
              prompts: PromptSynthesizer, output: OutputConfig, search: SearchConfig) -> int:
    """The goodput search; 0 when it finished (even with goodput 0), 1 when it stopped on an error
    (what was measured before is still printed and written, then the error)."""
    console = Console()
    if run_config.mode == "concurrency":
        console.print("[red]a sweep varies the request rate: drop --concurrency (--max-concurrency is fine)")
        return 1
    if not slo.is_set:
        console.print("[red]a sweep needs at least one SLO: --ttft-slo-ms, --tpot-slo-ms or --e2el-slo-ms")
        return 1
    outcome = run_sweep(make, workload, prompts, run_config, slo, search, output.show_progress, console)
    if outcome.probes:
        _report_sweep(console, outcome, workload, run_config, slo, prompts, output, search)
    if outcome.error is not None:
        console.print(f"[red]the sweep stopped after {len(outcome.probes)} probe(s): {outcome.error}")
        return 1
    return 0


def _report_sweep(console: Console, outcome: SweepOutcome, workload: WorkloadConfig, run_config: RunConfig,
                  slo: SLO, prompts: PromptSynthesizer, output: OutputConfig, search: SearchConfig) -> None:
    found, probes = outcome.search, outcome.probes
    table = Table(title=f"{output.label}: goodput search (target {search.target:.0%} of requests within SLO)")
    for column in ("rate (req/s)", "attainment", "completed", "failed", "p90 TTFT ms", "p90 TPOT ms"):
        table.add_column(column, justify="right")
    for probe in probes:
        s = probe.summary
        table.add_row(f"{probe.rate_rps:.3f}", f"{s['slo_attainment']:.1%}", str(s["completed"]), str(s["failed"]),
                      f"{s['p90_ttft_ms']:.1f}", f"{s['p90_tpot_ms']:.1f}")
    console.print(table)
    note = "" if found.bracketed else " (not bracketed: at a search limit or out of probes)"
    if outcome.error is not None:
        note = " (incomplete: the search stopped on an error; from the probes above)"
    console.print(f"goodput: [bold]{found.goodput_rps:.3f} req/s[/bold]{note}")
    backend = probes[0].result.backend
    payload = {
        **_metadata(workload, run_config, slo, prompts, None), "endpoint_type": backend, "backend": backend,
        "label": output.label, "goodput_rps": found.goodput_rps, "bracketed": found.bracketed,
        "attainment_target": search.target, "complete": outcome.error is None, "error": outcome.error,
        "probes": [{"rate_rps": p.rate_rps, **p.summary} for p in probes],
    }
    json_path = write_json(output.path("_sweep.json"), payload)
    attainment_png = plot_attainment({output.label: found.curve}, output.path("_attainment.png"), search.target,
                                     {output.label: found.goodput_rps})
    cdf_png = plot_latency_cdfs({f"{p.rate_rps:.3g} req/s": p.result.records for p in probes},
                                output.path("_sweep_cdfs.png"), slo)
    console.print(f"wrote {json_path}, {attainment_png} and {cdf_png}")
