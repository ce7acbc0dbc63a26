"""Goodput of pdserve (1 prefill + 1 decode worker, one core each) against vLLM's own OpenAI
server colocated on the same two cores, on the Azure conversation trace. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: `python bench/goodput_vs_vllm.py`

from goodput_vs_vllm_budget import Budget, estimate_run_s, quiet_wait_s, skip_reason  # noqa: E402
from goodput_vs_vllm_noise import OtherLoad, wait_for_quiet  # noqa: E402
from goodput_vs_vllm_report import NOISY_OTHER_CORES, Measurement, Skipped, SLOPair, quiet_runs, report  # noqa: E402
from goodput_vs_vllm_systems import PdserveDisaggregated, VllmServers  # noqa: E402
from loadgen.harness import WorkloadConfig, run_with_progress  # noqa: E402
from loadgen.metrics import SLO, summarize  # noqa: E402
from loadgen.prompts import PromptSynthesizer  # noqa: E402
from loadgen.runner import RunConfig  # noqa: E402
from loadgen.workload import RequestSpec  # noqa: E402
from pdserve.engine import EngineSettings  # noqa: E402

DESCRIPTION = """\
Side by side, in one run, on the same two cores and the same `bench` model:
  A  vLLM's own OpenAI server, colocated: one engine on both cores (VLLM_CPU_OMP_THREADS_BIND=0-1)
  B  pdserve: 1 prefill worker on core 0 + 1 decode worker on core 1, KV over tcp (LocalCluster)
  C  (--with-c) two vLLM servers, one per core, requests dealt round robin: one core per engine
     like B, without disaggregation
Workload: one fixed request set, the first N requests of the Azure LLM inference conversation
trace (lengths capped to the context), replayed at every offered rate with the trace's arrival
gaps rescaled to that rate (its burstiness is kept; N / rate seconds of arrivals): the rate is the
only thing that changes between runs. Prompts are token ids, identical for all systems at a given
rate (a fresh set of ids per rate); prefix caching is off in every system (a re-measured run
resends its prompts), and every request generates exactly its trace output length.

For every rate the systems are measured one after the other (ABBA order: A,B at the first rate,
B,A at the next, ...; with C: A,B,C then C,B,A), so machine noise hits all; only one system is up
at a time, and each run starts with uncounted warm-up requests, after waiting up to 45 s for other
processes to go quiet. A request is good when it meets the TTFT SLO and the TPOT SLO; two SLO pairs
share one TTFT SLO, with a tight and a loose TPOT. Goodput = the offered rate at which SLO
attainment first falls below 90% (interpolated between the grid's rates). Reported: the goodput of
each system per SLO pair and the ratios to A, attainment-vs-rate plots (one per SLO pair), latency
CDFs, and how much CPU other processes took during each run. The machine may be shared: a run
during which they took over 0.25 cores is "noisy"; it is measured once more, the quieter attempt is
kept, and if still noisy it is shown but not used for goodput. A system that has missed the target
under the loose SLOs in two quiet runs is not run at higher rates: its goodput is settled.

Time budget (--budget-min, default 19): the whole run, every quiet wait, re-measurement and run
included, fits in it. A point whose estimated time (server start, N / rate of arrivals, warm-up
and drain) no longer fits is skipped, and so are that system's higher rates (no holes in its
curve); a quiet wait is cut short and a re-measurement dropped when time is short, and a run
still going at the budget's end is cut. The report lists every point skipped or cut for time.
About 16 minutes on a quiet machine with A and B; --with-c adds about 10 (C runs every rate and
each of its starts brings up two servers: pass --budget-min 30); --quick about 5.

Writes bench/results/<label>.json, <label>.md (tables for BENCHMARKS.md), <label>_attainment_<pair>.png
and <label>_cdf_<rate>rps.png.
"""


@dataclass(frozen=True)
class BenchConfig:
    rates_rps: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0)
    num_requests: int = 30  # the same first N trace requests at every rate (N / rate s of arrivals)
    stop_after_failures: int = 2  # a system is not run at higher rates once it missed the target at this many
    max_model_len: int = 4096
    max_prompt_tokens: int = 2000
    max_output_tokens: int = 256
    kv_cache_mib: int = 512  # per pdserve worker; vLLM gets twice this (the same total)
    max_num_seqs: int = 64
    ttft_slo_s: float = 1.5
    tpot_tight_s: float = 0.030
    tpot_loose_s: float = 0.060
    attainment_target: float = 0.9
    warmup_requests: int = 3
    request_timeout_s: float = 120.0
    quiet_cores: float = NOISY_OTHER_CORES  # before each run, wait until other processes use at most this many cores ...
    max_quiet_wait_s: float = 45.0  # ... or this long (the machine is shared); a run above it is "noisy"
    noisy_retries: int = 1  # a noisy run is measured again this many times; the quietest attempt is kept
    seed: int = 0
    with_c: bool = False  # also measure C: two 1-core vLLM servers, round robin
    budget_s: float = 19 * 60.0  # the whole run, report included
    start_estimate_s: float = 45.0  # per server brought up (vLLM or a pdserve cluster)
    run_overhead_s: float = 20.0  # per run beyond its arrivals: warm-up, the last requests' tail, quiet check
    report_reserve_s: float = 30.0  # kept for writing the report and plots
    colocated_cores: str = "0-1"
    prefill_cores: str = "0"
    decode_cores: str = "1"
    model_dir: Path = REPO / "models" / "bench"
    trace_path: Path | None = None  # default: <repo>/../shared/data/traces/AzureLLMInferenceTrace_conv.csv
    out_dir: Path = REPO / "bench" / "results"
    label: str = "goodput_vs_vllm"
    cdf_rates_rps: tuple[float, ...] = field(default=(0.5, 1.0))

    def __post_init__(self) -> None:
        rates = self.rates_rps
        if not rates or any(r <= 0 for r in rates) or list(rates) != sorted(set(rates)):
            raise ValueError(f"rates must be distinct, positive and ascending (req/s), got {rates}")
        if self.max_prompt_tokens + self.max_output_tokens > self.max_model_len:
            raise ValueError(f"max_prompt_tokens + max_output_tokens ({self.max_prompt_tokens} + "
                             f"{self.max_output_tokens}) must fit max_model_len {self.max_model_len}: lower a cap")
        if not 0 < self.tpot_tight_s < self.tpot_loose_s:
            raise ValueError(f"need 0 < tight TPOT SLO < loose TPOT SLO, got {self.tpot_tight_s}, {self.tpot_loose_s}")
        if not self.ttft_slo_s > 0:
            raise ValueError(f"the TTFT SLO must be > 0 s, got {self.ttft_slo_s}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if not self.budget_s > self.report_reserve_s:
            raise ValueError(f"the time budget ({self.budget_s:g} s) must exceed the report's reserve "
                             f"({self.report_reserve_s:g} s): raise --budget-min")

    @property
    def slo_pairs(self) -> tuple[SLOPair, ...]:
        return (SLOPair("tight", SLO(ttft_s=self.ttft_slo_s, tpot_s=self.tpot_tight_s)),
                SLOPair("loose", SLO(ttft_s=self.ttft_slo_s, tpot_s=self.tpot_loose_s)))

    @property
    def systems(self) -> tuple[str, ...]:
        return ("A", "B", "C") if self.with_c else ("A", "B")

    def engine_settings(self) -> EngineSettings:
        """Prefix caching off: a re-measured (noisy) run resends the same prompts, which must not hit
        the cache; the trace's random-token prompts share no prefixes anyway."""
        return EngineSettings(model=str(self.model_dir), max_model_len=self.max_model_len,
                              kv_cache_bytes=self.kv_cache_mib << 20, max_num_seqs=self.max_num_seqs, seed=self.seed,
                              enable_prefix_caching=False)


QUICK = dict(rates_rps=(0.5, 1.0, 2.0), num_requests=16, warmup_requests=2, noisy_retries=0,
             budget_s=6 * 60.0, label="goodput_vs_vllm_quick", cdf_rates_rps=(1.0,))


def schedule(num_rates: int, systems: tuple[str, ...] = ("A", "B")) -> list[tuple[str, int]]:
    """(system, rate index) in ABBA order: A,B at rate 0, B,A at rate 1, ... (A,B,C then C,B,A with
    three) so each rate costs one server switch and all systems are measured close in time."""
    return [(key, i) for i in range(num_rates) for key in (systems if i % 2 == 0 else systems[::-1])]


def workload(config: BenchConfig, rate_rps: float) -> list[RequestSpec]:
    """The same `num_requests` trace requests at every rate, their gaps rescaled so the last arrives
    at num_requests / rate_rps."""
    return WorkloadConfig(kind="trace", arrival="trace", rate_rps=None, trace_path=config.trace_path,
                          max_prompt_tokens=config.max_prompt_tokens, max_output_tokens=config.max_output_tokens,
                          num_requests=config.num_requests).build(rate_rps=rate_rps)


def prompts_for(config: BenchConfig, rate_index: int, vocab_size: int) -> PromptSynthesizer:
    """The same token ids for every system at one rate; another set at each rate (no cross-run cache hits)."""
    return PromptSynthesizer(seed=config.seed * 1000 + rate_index, token_id_low=10, token_id_high=vocab_size - 10)


def measure(system, rate_rps: float, specs: list[RequestSpec], prompts: PromptSynthesizer,
            config: BenchConfig, title: str, restarted: bool, budget: Budget) -> Measurement | None:
    """One run after waiting for a quiet machine; a noisy run (other processes above
    `quiet_cores`) is measured again up to `noisy_retries` times while the budget allows, and the
    quietest attempt kept. A run still going when the budget (less the report's reserve) ends is
    cut; None when no attempt finished."""
    run_config = RunConfig(warmup_requests=config.warmup_requests, request_timeout_s=config.request_timeout_s)
    need_s = estimate_run_s(config, rate_rps)
    attempts: list[Measurement] = []
    while len(attempts) <= config.noisy_retries:
        if attempts and skip_reason(config, budget.remaining_s(), need_s) is not None:
            break  # no time to re-measure: keep the noisy attempt
        wait_for_quiet(config.quiet_cores, quiet_wait_s(config, budget.remaining_s(), need_s))
        other = OtherLoad.start()
        suffix = f" retry (noise {attempts[-1].other_load_cores:.1f} cores)" if attempts else ""
        running = run_with_progress(system.target(), specs, prompts, run_config, title + suffix)
        try:
            result = asyncio.run(asyncio.wait_for(running, budget.remaining_s() - config.report_reserve_s))
        except TimeoutError:
            other.stop()
            break
        other_cores = other.stop()
        summaries = {p.name: summarize(result.records, result.duration_s, p.slo) for p in config.slo_pairs}
        attempts.append(Measurement(system.key, rate_rps, result, summaries, other_cores, restarted, len(attempts) + 1))
        if other_cores <= config.quiet_cores:
            break
    return min(attempts, key=lambda m: m.other_load_cores) if attempts else None


def settled(measurements: list[Measurement], system: str, config: BenchConfig) -> bool:
    """True once `system` missed the attainment target under the loose SLO pair (and so under
    every pair) in `stop_after_failures` quiet runs: its goodput is known, higher rates only cost time."""
    loose = config.slo_pairs[-1].name
    misses = sum(m.system == system and m.summaries[loose]["slo_attainment"] < config.attainment_target
                 for m in quiet_runs(measurements))
    return misses >= config.stop_after_failures


def make_systems(config: BenchConfig, log_dir: Path) -> dict:
    settings = config.engine_settings()
    systems = {"A": VllmServers.colocated(settings, config.colocated_cores, log_dir),
               "B": PdserveDisaggregated(settings, config.prefill_cores, config.decode_cores, log_dir)}
    if config.with_c:
        systems["C"] = VllmServers.pair(settings, (config.prefill_cores, config.decode_cores), log_dir)
    return systems


def run_all(config: BenchConfig, console: Console, budget: Budget) -> tuple[list[Measurement], list[Skipped]]:
    """Every (system, rate) run in ABBA order, one system up at a time, until a system is
    `settled`; a system found dead between runs is restarted (its next measurement says so).
    Points that do not fit the time budget, or were cut by it, are returned as skipped."""
    from pdserve.make_model import build_model

    model_dir = build_model("bench", config.model_dir)  # cached: returns at once when already built
    vocab_size = _vocab_size(model_dir)
    log_dir = Path(tempfile.mkdtemp(prefix=f"{config.label}-logs-"))
    console.print(f"server logs: {log_dir}")
    systems = make_systems(config, log_dir)
    plan = schedule(len(config.rates_rps), config.systems)
    measurements: list[Measurement] = []
    skipped: list[Skipped] = []
    current = None
    try:
        for step, (key, i) in enumerate(plan, 1):
            if settled(measurements, key, config):
                continue
            rate, wanted = config.rates_rps[i], systems[key]
            switch = current is not wanted or not current.healthy()
            need_s = estimate_run_s(config, rate, wanted.servers if switch else 0)
            reason = skip_reason(config, budget.remaining_s(), need_s)
            if any(s.system == key for s in skipped):  # no holes in a system's curve
                reason = "time budget: a lower rate of this system was already skipped"
            if reason is not None:
                skipped.append(Skipped(key, rate, reason))
                console.print(f"[yellow]skipped {key} @ {rate:g} req/s: {reason}")
                continue
            restarted = switch and current is wanted
            current = _switch(current, wanted, console) if switch else current
            title = f"[{step}/{len(plan)}] {key} @ {rate:g} req/s"
            m = measure(current, rate, workload(config, rate), prompts_for(config, i, vocab_size),
                        config, title, restarted, budget)
            if m is None:
                skipped.append(Skipped(key, rate, "time budget: the run was cut at the budget's end"))
            else:
                measurements.append(m)
    finally:
        if current is not None:
            current.stop()
    return measurements, skipped


def _switch(current, wanted, console: Console):
    if current is not None:
        current.stop()
    started = time.monotonic()
    with console.status(f"starting {wanted.label} ..."):
        wanted.start()
    console.print(f"{wanted.label}: up in {time.monotonic() - started:.0f} s")
    return wanted


def _vocab_size(model_dir: Path) -> int:
    import json

    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def parse_args(argv: list[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rates, shorter runs, no re-runs (~5 min): a smoke run")
    parser.add_argument("--rates", type=lambda s: tuple(float(r) for r in s.split(",")),
                        help="offered rates, req/s, comma-separated ascending (default 0.25,0.5,0.75,1,1.5,2,2.5,3)")
    parser.add_argument("--num-requests", type=int, help="the first N trace requests, replayed at every rate (default 30)")
    parser.add_argument("--budget-min", type=float, help="the whole run fits in this many minutes (default 19; --quick 6)")
    parser.add_argument("--with-c", action="store_true",
                        help="also measure C: two 1-core vLLM servers, round robin (~10 more minutes: pass --budget-min 30)")
    parser.add_argument("--ttft-slo-ms", type=float, help="TTFT SLO (default 1500)")
    parser.add_argument("--tpot-tight-ms", type=float, help="tight TPOT SLO (default 30)")
    parser.add_argument("--tpot-loose-ms", type=float, help="loose TPOT SLO (default 60)")
    parser.add_argument("--trace", type=Path, help="Azure trace CSV (default <repo>/../shared/data/traces/...conv.csv)")
    parser.add_argument("--out-dir", type=Path, help="where results go (default bench/results)")
    parser.add_argument("--label", help="file name stem (default goodput_vs_vllm, or goodput_vs_vllm_quick)")
    parser.add_argument("--seed", type=int, help="prompt seed (default 0)")
    args = parser.parse_args(argv)
    given = {name: value for name, value in (
        ("rates_rps", args.rates), ("num_requests", args.num_requests), ("trace_path", args.trace),
        ("budget_s", None if args.budget_min is None else args.budget_min * 60), ("with_c", args.with_c or None),
        ("out_dir", args.out_dir), ("label", args.label), ("seed", args.seed),
        ("ttft_slo_s", _s(args.ttft_slo_ms)), ("tpot_tight_s", _s(args.tpot_tight_ms)),
        ("tpot_loose_s", _s(args.tpot_loose_ms))) if value is not None}
    try:
        return BenchConfig(**((QUICK if args.quick else {}) | given))
    except ValueError as bad:
        parser.error(str(bad))


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)  # tables stay readable in a log
    budget = Budget(config.budget_s)
    started = time.monotonic()
    measurements, skipped = run_all(config, console, budget)
    report(config, measurements, console, wall_s=time.monotonic() - started, argv=sys.argv, skipped=skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
