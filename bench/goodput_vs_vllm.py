"""Goodput of pdserve (1 prefill + 1 decode worker, one core each) against vLLM's own OpenAI
server colocated on the same two cores, on the Azure conversation trace. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: `python bench/goodput_vs_vllm.py`

from goodput_vs_vllm_noise import OtherLoad, wait_for_quiet  # noqa: E402
from goodput_vs_vllm_report import NOISY_OTHER_CORES, Measurement, SLOPair, quiet_runs, report  # noqa: E402
from goodput_vs_vllm_systems import ColocatedVllm, PdserveDisaggregated  # noqa: E402
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
Workload: the Azure LLM inference conversation trace (its first N requests, lengths capped to the
context, arrival gaps rescaled to each offered rate, so its burstiness is kept). Prompts are token
ids, identical for A and B at a given rate (a fresh set per rate), prefix caching is off in both (a
re-measured run resends its prompts), and every request generates exactly its trace output length.

For every rate A and B are measured one after the other (ABBA order: A,B at the first rate, B,A at
the next, ...), so machine noise hits both; only one system is up at a time, and each run starts
with uncounted warm-up requests, after waiting up to 45 s for other processes to go quiet. A request
is good when it meets the TTFT SLO and the TPOT SLO; two SLO pairs share one TTFT SLO, with a tight
and a loose TPOT. Goodput = the offered rate at which SLO attainment first falls below 90%
(interpolated between the grid's rates). Reported: the goodput of each system per SLO pair and the
ratio B/A, attainment-vs-rate plots (one per SLO pair), latency CDFs, and how much CPU other
processes took during each run. The machine may be shared: a run during which they took over 0.25
cores is "noisy"; it is measured once more, the quieter attempt is kept, and if still noisy
it is shown but not used for goodput. A system that has missed the target under the loose SLOs in
two quiet runs is not run at higher rates: its goodput is settled.

Writes bench/results/<label>.json, <label>.md (tables for BENCHMARKS.md), <label>_attainment_<pair>.png
and <label>_cdf_<rate>rps.png. A full run takes 15-20 minutes on a quiet machine; --quick about 5.
"""


@dataclass(frozen=True)
class BenchConfig:
    rates_rps: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0)
    seconds_per_rate: float = 30.0  # each run sends max(min_requests, rate * this) requests
    min_requests: int = 12
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
        if self.min_requests < 1 or self.seconds_per_rate <= 0:
            raise ValueError("min_requests must be >= 1 and seconds_per_rate > 0")

    @property
    def slo_pairs(self) -> tuple[SLOPair, ...]:
        return (SLOPair("tight", SLO(ttft_s=self.ttft_slo_s, tpot_s=self.tpot_tight_s)),
                SLOPair("loose", SLO(ttft_s=self.ttft_slo_s, tpot_s=self.tpot_loose_s)))

    def num_requests(self, rate_rps: float) -> int:
        return max(self.min_requests, math.ceil(rate_rps * self.seconds_per_rate))

    def engine_settings(self) -> EngineSettings:
        """Prefix caching off: a re-measured (noisy) run resends the same prompts, which must not hit
        the cache; the trace's random-token prompts share no prefixes anyway."""
        return EngineSettings(model=str(self.model_dir), max_model_len=self.max_model_len,
                              kv_cache_bytes=self.kv_cache_mib << 20, max_num_seqs=self.max_num_seqs, seed=self.seed,
                              enable_prefix_caching=False)


QUICK = dict(rates_rps=(0.5, 1.0, 2.0), seconds_per_rate=20.0, min_requests=10, warmup_requests=2,
             noisy_retries=0, label="goodput_vs_vllm_quick", cdf_rates_rps=(1.0,))


def schedule(num_rates: int) -> list[tuple[str, int]]:
    """(system, rate index) in ABBA order: A,B at rate 0, B,A at rate 1, ... so each switch of
    system is one server restart and both systems are measured close in time at every rate."""
    return [(key, i) for i in range(num_rates) for key in (("A", "B") if i % 2 == 0 else ("B", "A"))]


def workload(config: BenchConfig, rate_rps: float) -> list[RequestSpec]:
    return WorkloadConfig(kind="trace", arrival="trace", rate_rps=None, trace_path=config.trace_path,
                          max_prompt_tokens=config.max_prompt_tokens, max_output_tokens=config.max_output_tokens,
                          num_requests=config.num_requests(rate_rps)).build(rate_rps=rate_rps)


def prompts_for(config: BenchConfig, rate_index: int, vocab_size: int) -> PromptSynthesizer:
    """The same token ids for A and B at one rate; another set at each rate (no cross-run cache hits)."""
    return PromptSynthesizer(seed=config.seed * 1000 + rate_index, token_id_low=10, token_id_high=vocab_size - 10)


def measure(system, rate_rps: float, specs: list[RequestSpec], prompts: PromptSynthesizer,
            config: BenchConfig, title: str, restarted: bool) -> Measurement:
    """One run after waiting for a quiet machine; a noisy run (other processes above
    `quiet_cores`) is measured again up to `noisy_retries` times and the quietest attempt kept."""
    run_config = RunConfig(warmup_requests=config.warmup_requests, request_timeout_s=config.request_timeout_s)
    attempts: list[Measurement] = []
    while len(attempts) <= config.noisy_retries:
        wait_for_quiet(config.quiet_cores, config.max_quiet_wait_s)
        other = OtherLoad.start()
        suffix = f" retry (noise {attempts[-1].other_load_cores:.1f} cores)" if attempts else ""
        result = asyncio.run(run_with_progress(system.target(), specs, prompts, run_config, title + suffix))
        other_cores = other.stop()
        summaries = {p.name: summarize(result.records, result.duration_s, p.slo) for p in config.slo_pairs}
        attempts.append(Measurement(system.key, rate_rps, result, summaries, other_cores, restarted, len(attempts) + 1))
        if other_cores <= config.quiet_cores:
            break
    return min(attempts, key=lambda m: m.other_load_cores)


def settled(measurements: list[Measurement], system: str, config: BenchConfig) -> bool:
    """True once `system` missed the attainment target under the loose SLO pair (and so under
    every pair) in `stop_after_failures` quiet runs: its goodput is known, higher rates only cost time."""
    loose = config.slo_pairs[-1].name
    misses = sum(m.system == system and m.summaries[loose]["slo_attainment"] < config.attainment_target
                 for m in quiet_runs(measurements))
    return misses >= config.stop_after_failures


def run_all(config: BenchConfig, console: Console) -> list[Measurement]:
    """Every (system, rate) run in ABBA order, one system up at a time, until a system is
    `settled`; a system found dead between runs is restarted (its next measurement says so)."""
    from pdserve.make_model import build_model

    model_dir = build_model("bench", config.model_dir)  # cached: returns at once when already built
    vocab_size = _vocab_size(model_dir)
    settings = config.engine_settings()
    log_dir = Path(tempfile.mkdtemp(prefix=f"{config.label}-logs-"))
    console.print(f"server logs: {log_dir}")
    systems = {"A": ColocatedVllm(settings, config.colocated_cores, log_dir),
               "B": PdserveDisaggregated(settings, config.prefill_cores, config.decode_cores, log_dir)}
    plan = schedule(len(config.rates_rps))
    measurements, current = [], None
    try:
        for step, (key, i) in enumerate(plan, 1):
            if settled(measurements, key, config):
                continue
            rate, restarted = config.rates_rps[i], False
            if current is not systems[key] or not current.healthy():
                restarted = current is systems[key]
                current = _switch(current, systems[key], console)
            title = f"[{step}/{len(plan)}] {key} @ {rate:g} req/s"
            measurements.append(measure(current, rate, workload(config, rate), prompts_for(config, i, vocab_size),
                                        config, title, restarted))
    finally:
        if current is not None:
            current.stop()
    return measurements


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
    parser.add_argument("--seconds-per-rate", type=float, help="arrivals span this long per run (default 30)")
    parser.add_argument("--ttft-slo-ms", type=float, help="TTFT SLO (default 1500)")
    parser.add_argument("--tpot-tight-ms", type=float, help="tight TPOT SLO (default 30)")
    parser.add_argument("--tpot-loose-ms", type=float, help="loose TPOT SLO (default 60)")
    parser.add_argument("--trace", type=Path, help="Azure trace CSV (default <repo>/../shared/data/traces/...conv.csv)")
    parser.add_argument("--out-dir", type=Path, help="where results go (default bench/results)")
    parser.add_argument("--label", help="file name stem (default goodput_vs_vllm, or goodput_vs_vllm_quick)")
    parser.add_argument("--seed", type=int, help="prompt seed (default 0)")
    args = parser.parse_args(argv)
    given = {name: value for name, value in (
        ("rates_rps", args.rates), ("seconds_per_rate", args.seconds_per_rate), ("trace_path", args.trace),
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
    started = time.monotonic()
    measurements = run_all(config, console)
    report(config, measurements, console, wall_s=time.monotonic() - started, argv=sys.argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
