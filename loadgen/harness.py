"""From configuration to results: build the workload, run it with a live progress bar, summarize,
and the goodput sweep around it. The CLI (`pdserve load`) and `bench/` scripts call these."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loadgen import workload as wl
from loadgen.metrics import SLO, summarize
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RequestRecord, RunConfig, RunResult, run
from loadgen.sweep import SearchConfig, SearchResult, find_goodput, stopped_search
from loadgen.targets.base import Target
from loadgen.targets.openai_http import RequestShape

Arrival = Literal["poisson", "gamma", "constant", "trace"]


@dataclass(frozen=True)
class WorkloadConfig:
    """What to send. kind: random lengths, trace replay, or shared prefix + random suffixes.
    arrival "trace" (trace kind only) keeps the trace's own timestamps, scaled by time_scale,
    or rescaled to `rate_rps` when one is given (the sweep always gives one)."""

    kind: Literal["random", "trace", "shared-prefix"] = "random"
    arrival: Arrival = "poisson"
    rate_rps: float | None = 1.0  # None: trace timing / concurrency mode (all at once)
    cv: float = 1.0  # gamma arrivals: std/mean of the gaps
    num_requests: int = 100
    prompt_mean: int = 512
    output_mean: int = 128
    range_ratio: float = 0.0
    trace_path: Path | None = None
    time_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    num_groups: int = 4
    prefix_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arrival == "trace" and self.kind != "trace":
            raise ValueError("arrival 'trace' replays trace timestamps: use it with kind 'trace'")
        if self.arrival != "trace" and self.rate_rps is None:
            raise ValueError(f"{self.arrival} arrivals need a rate (requests/s)")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")

    def build(self, rate_rps: float | None = None, num_requests: int | None = None) -> list[wl.RequestSpec]:
        """The request list; `rate_rps`/`num_requests` override the configured ones (sweep, duration)."""
        rate = rate_rps if rate_rps is not None else self.rate_rps
        n = num_requests if num_requests is not None else self.num_requests
        if self.kind == "trace":
            specs = wl.azure_trace(self.trace_path, self.time_scale, self.max_prompt_tokens,
                                   self.max_output_tokens, limit=n)
            if self.arrival == "trace":
                return wl.retime(specs, rate_rps=rate) if rate is not None else specs
            return wl.retime(specs, arrivals_s=self._arrivals(rate, len(specs)))
        arrivals = self._arrivals(rate, n)
        if self.kind == "shared-prefix":
            suffixes = wl.uniform_lengths(n, self.prompt_mean, self.output_mean, self.range_ratio, self.seed)
            return wl.shared_prefix(arrivals, self.num_groups, self.prefix_tokens, suffixes, self.seed)
        return wl.combine(arrivals, wl.uniform_lengths(n, self.prompt_mean, self.output_mean,
                                                       self.range_ratio, self.seed))

    def _arrivals(self, rate_rps: float, n: int) -> list[float]:
        if self.arrival == "poisson":
            return wl.poisson(rate_rps, n, self.seed)
        if self.arrival == "gamma":
            return wl.gamma(rate_rps, self.cv, n, self.seed)
        return wl.constant(rate_rps, n)


def requests_for_duration(rate_rps: float, duration_s: float) -> int:
    """Enough requests that an open-loop process at rate_rps outlasts duration_s (the runner
    stops sending at duration_s): expected count + 6 standard deviations + 10."""
    expected = rate_rps * duration_s
    return int(math.ceil(expected + 6 * math.sqrt(expected) + 10))


def make_target(backend: Literal["openai", "pdserve"], address: str, model: str | None = None,
                temperature: float = 0.0, api_key: str | None = None, shape: RequestShape = RequestShape(),
                tls: bool = False, ca_file: str | None = None) -> Target:
    """`shape` (endpoint, prompt format, vLLM's extension fields) applies to the openai backend only.
    `ca_file`: a PEM file of the certificates to trust (a self-signed router's); for gRPC it implies
    TLS, as `tls` does (an https:// URL says it for OpenAI)."""
    if backend == "openai":
        from loadgen.targets.openai_http import OpenAITarget

        return OpenAITarget(address, model=model, temperature=temperature, api_key=api_key, shape=shape,
                            ca_file=ca_file)
    if backend == "pdserve":
        from pathlib import Path

        from loadgen.targets.pdserve_grpc import PdserveGrpcTarget

        roots = Path(ca_file).read_bytes() if ca_file else None
        return PdserveGrpcTarget(address, temperature=temperature, api_key=api_key, tls=tls, root_certificates=roots)
    raise ValueError(f"backend must be 'openai' or 'pdserve', got {backend!r}")


async def run_with_progress(target: Target, specs: list[wl.RequestSpec], prompts: PromptSynthesizer,
                            config: RunConfig, description: str = "requests", show: bool = True,
                            console: Console | None = None) -> RunResult:
    """Open the target, run, close it; a live rich bar on `console` (default: rich's) counts ok /
    refused / failed / timed-out requests. On a console that is not a terminal the bar is drawn once, at the end."""
    total = None if config.mode == "concurrency" and config.duration_s else len(specs)
    counts = {"ok": 0, "refused": 0, "error": 0, "timeout": 0}   # one per runner.Status
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("ok {task.fields[ok]} · refused {task.fields[refused]} · failed {task.fields[error]} · "
                          "timed out {task.fields[timeout]}"),
               TimeElapsedColumn())
    with Progress(*columns, disable=not show, console=console) as progress:
        task = progress.add_task(description, total=total, **counts)

        def on_done(record: RequestRecord) -> None:
            counts[record.status] += 1
            progress.update(task, advance=1, **counts)

        await target.open()
        try:
            return await run(target, specs, prompts, config, on_done)
        finally:
            await target.close()


async def run_all_ok(target: Target, specs: list[wl.RequestSpec], prompts: PromptSynthesizer,
                     config: RunConfig | None = None) -> RunResult:
    """Open the target, run `specs`, close it; RuntimeError naming the first failure when any
    request was not served (a benchmark reading what a load costs needs all of it served)."""
    await target.open()
    try:
        result = await run(target, specs, prompts, config or RunConfig())
    finally:
        await target.close()
    failed = [r for r in result.records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(result.records)} requests failed: {failed[0].error}")
    return result


@dataclass(frozen=True)
class SweepProbe:
    rate_rps: float
    result: RunResult
    summary: dict[str, Any]


@dataclass(frozen=True)
class SweepOutcome:
    """A sweep's result. `error` set: the search stopped there (a target failed to open, an
    interrupt, ...); `search` and `probes` then hold what was measured before (never bracketed)."""

    search: SearchResult
    probes: list[SweepProbe]
    error: str | None = None


def run_sweep(make: Callable[[], Target], workload: WorkloadConfig, prompts: PromptSynthesizer,
              run_config: RunConfig, slo: SLO, search: SearchConfig,
              show: bool = True, console: Console | None = None) -> SweepOutcome:
    """Find the goodput by running one benchmark per probed rate (a fresh target each time).
    Never raises once probing started: a failure ends the search and is returned with the probes
    measured before it (only a sweep without any SLO raises, at once)."""
    if not slo.is_set:
        raise ValueError("a goodput sweep needs at least one SLO (TTFT, TPOT or E2E latency)")
    probes: list[SweepProbe] = []

    def measure(rate_rps: float) -> float:
        n = None
        if run_config.duration_s is not None:  # enough requests to last the duration at this rate
            n = max(workload.num_requests, requests_for_duration(rate_rps, run_config.duration_s))
        specs = workload.build(rate_rps=rate_rps, num_requests=n)
        label = f"probe {len(probes) + 1}: {rate_rps:.3g} req/s"
        result = asyncio.run(run_with_progress(make(), specs, prompts, run_config, label, show, console))
        summary = summarize(result.records, result.duration_s, slo)
        probes.append(SweepProbe(rate_rps, result, summary))
        return summary["slo_attainment"]

    try:
        return SweepOutcome(find_goodput(measure, search), probes)
    except (Exception, KeyboardInterrupt) as stopped:  # kept with what was measured; the caller reports it
        curve = [(p.rate_rps, p.summary["slo_attainment"]) for p in probes]
        return SweepOutcome(stopped_search(curve, search.target), probes, f"{type(stopped).__name__}: {stopped}")
