"""Reports of a run: a rich summary table and a JSON file in `vllm bench serve`'s result shape."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen.metrics import PHASES, distribution_ms
from loadgen.runner import RunResult

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"))


def per_request_arrays(result: RunResult) -> dict[str, list[Any]]:
    """vLLM's per-request lists (failed requests read 0 / empty, their errors are kept)."""
    rs = result.records
    return {
        "input_lens": [r.prompt_tokens for r in rs],
        "output_lens": [r.output_tokens if r.ok else 0 for r in rs],
        "ttfts": [r.ttft_s or 0.0 for r in rs],
        "itls": [list(r.itls_s) for r in rs],
        "latencies": [r.e2el_s or 0.0 for r in rs],
        "start_times": [r.sent_s for r in rs],
        "queue_times": [r.client_queue_s for r in rs],
        "errors": [r.error for r in rs],
        "statuses": [r.status for r in rs],
    }


def result_json(result: RunResult, summary: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's result file: metadata, `endpoint_type` and `backend` (vLLM's backend names: openai,
    openai-chat; pdserve for the gRPC target), the summary, the per-request arrays and, with a
    concurrency cap, vLLM's client-queue distributions."""
    warm = result.warmup
    return {
        **metadata,
        "endpoint_type": result.backend,
        "backend": result.backend,
        "max_concurrency": result.config.max_concurrency,
        "warmup_requests": len(warm),
        "warmup_failed": sum(not r.ok for r in warm),
        **summary,
        **client_queue_stats(result),
        **per_request_arrays(result),
    }


def client_queue_stats(result: RunResult) -> dict[str, float]:
    """As vLLM with --max-concurrency: `*_client_queue_time_ms` over successful requests, and in
    arrivals mode `*_e2el_including_client_queue_ms` (latency as seen from the arrival); {} uncapped."""
    if result.config.max_concurrency is None:
        return {}
    good = [r for r in result.records if r.ok]
    stats = distribution_ms("client_queue_time", [r.client_queue_s for r in good])
    if result.config.mode == "arrivals":
        stats |= distribution_ms("e2el_including_client_queue", [r.e2el_s + r.client_queue_s for r in good])
    return stats


def write_json(path: Path, payload: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def summary_tables(summary: Mapping[str, Any], title: str = "Benchmark result") -> list[Table]:
    totals = Table(title=title, show_header=False)
    totals.add_column("metric")
    totals.add_column("value", justify="right")
    rows = [
        ("requests sent", f"{summary['num_prompts']}"),
        ("completed / failed / timed out",
         f"{summary['completed']} / {summary['failed']} / {summary['timed_out']}"),
        ("duration (s)", f"{summary['duration']:.2f}"),
        ("request throughput (req/s)", f"{summary['request_throughput']:.3f}"),
        ("output token throughput (tok/s)", f"{summary['output_throughput']:.1f}"),
        ("total token throughput (tok/s)", f"{summary['total_token_throughput']:.1f}"),
    ]
    if summary.get("slo_attainment") is not None:
        rows += [("SLO attainment", f"{summary['slo_attainment']:.1%}"),
                 ("request goodput (good req/s)", f"{summary['request_goodput']:.3f}")]
    if summary.get("output_len_mismatches"):
        rows.append(("outputs not of the requested length", f"{summary['output_len_mismatches']}"))
    for row in rows:
        totals.add_row(*row)
    tables = [totals, _latency_table(summary)]
    if summary.get("errors_by_kind"):
        errors = Table(title="Failed requests by error")
        errors.add_column("count", justify="right")
        errors.add_column("error")
        for message, count in summary["errors_by_kind"].items():
            errors.add_row(str(count), message)
        tables.append(errors)
    return tables


def _latency_table(summary: Mapping[str, Any]) -> Table:
    table = Table(title="Latency (ms)")
    columns = ["mean", "median"] + sorted(
        {k.split("_")[0] for k in summary if k.startswith("p") and k.endswith("_ttft_ms")},
        key=lambda p: float(p[1:]))
    table.add_column("metric")
    for column in columns:
        table.add_column(column, justify="right")
    named = list(LATENCIES) + [(p, f"phase: {p}") for p in PHASES if f"mean_{p}_ms" in summary]
    for key, label in named:
        table.add_row(label, *(f"{summary[f'{c}_{key}_ms']:.1f}" for c in columns))
    return table


def print_summary(summary: Mapping[str, Any], console: Console | None = None, title: str = "Benchmark result") -> None:
    console = console or Console()
    for table in summary_tables(summary, title):
        console.print(table)
