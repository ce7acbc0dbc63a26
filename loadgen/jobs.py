"""The two jobs behind `pdserve load`: one measured run, and the goodput sweep. Each prints rich
tables and writes a JSON file and PNG plots under `OutputConfig.directory`."""

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

from loadgen.harness import WorkloadConfig, run_sweep, run_with_progress
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


def _metadata(workload: WorkloadConfig, slo: SLO, rate_rps: float | None) -> dict[str, Any]:
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "request_rate": rate_rps if rate_rps is None or math.isfinite(rate_rps) else "inf",
        "burstiness": 1.0 / workload.cv**2 if workload.arrival == "gamma" else 1.0,
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
        result = asyncio.run(run_with_progress(target, specs, prompts, run_config, output.label, output.show_progress))
    except (TargetError, OSError) as unreachable:
        console.print(f"[red]could not start the run: {unreachable}")
        return 1
    summary = summarize(result.records, result.duration_s, slo)
    print_summary(summary, console, title=f"{output.label}: {result.backend}")
    _print_warmup(console, result.warmup)
    metadata = {"label": output.label, "model_id": getattr(target, "model", None),
                **_metadata(workload, slo, workload.rate_rps)}
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
    """The goodput search; 0 when it finished (even with goodput 0), 1 when the target was unreachable."""
    console = Console()
    if run_config.mode == "concurrency":
        console.print("[red]a sweep varies the request rate: drop --concurrency (--max-concurrency is fine)")
        return 1
    if not slo.is_set:
        console.print("[red]a sweep needs at least one SLO: --ttft-slo-ms, --tpot-slo-ms or --e2el-slo-ms")
        return 1
    try:
        found, probes = run_sweep(make, workload, prompts, run_config, slo, search, output.show_progress)
    except (TargetError, OSError) as unreachable:
        console.print(f"[red]could not run the sweep: {unreachable}")
        return 1
    table = Table(title=f"{output.label}: goodput search (target {search.target:.0%} of requests within SLO)")
    for column in ("rate (req/s)", "attainment", "completed", "failed", "p90 TTFT ms", "p90 TPOT ms"):
        table.add_column(column, justify="right")
    for probe in probes:
        s = probe.summary
        table.add_row(f"{probe.rate_rps:.3f}", f"{s['slo_attainment']:.1%}", str(s["completed"]), str(s["failed"]),
                      f"{s['p90_ttft_ms']:.1f}", f"{s['p90_tpot_ms']:.1f}")
    console.print(table)
    console.print(f"goodput: [bold]{found.goodput_rps:.3f} req/s[/bold]"
                  + ("" if found.bracketed else " (not bracketed: at a search limit or out of probes)"))
    payload = {
        **_metadata(workload, slo, None), "backend": probes[0].result.backend, "label": output.label,
        "goodput_rps": found.goodput_rps, "bracketed": found.bracketed, "attainment_target": search.target,
        "probes": [{"rate_rps": p.rate_rps, **p.summary} for p in probes],
    }
    json_path = write_json(output.path("_sweep.json"), payload)
    attainment_png = plot_attainment({output.label: found.curve}, output.path("_attainment.png"), search.target,
                                     {output.label: found.goodput_rps})
    cdf_png = plot_latency_cdfs({f"{p.rate_rps:.3g} req/s": p.result.records for p in probes},
                                output.path("_sweep_cdfs.png"), slo)
    console.print(f"wrote {json_path}, {attainment_png} and {cdf_png}")
    return 0
