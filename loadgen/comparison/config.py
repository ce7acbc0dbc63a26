"""What a comparison runs: the systems, the rate grid, the requests (the first N of a trace,
replayed at every rate), the SLO pairs, the time budget; the ABBA run order; the requests and
prompts of each rate. `CompareConfig` is validated when built and says how to fix a mistake.
Default paths are relative to the repository root, where the benchmarks run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from loadgen.comparison.goodput import NOISY_OTHER_CORES, SLOPair
from loadgen.harness import WorkloadConfig
from loadgen.metrics import SLO
from loadgen.prompts import PromptSynthesizer
from loadgen.workload import RequestSpec
from pdserve.engine import EngineSettings


PDSERVE_SYSTEMS = ("B", "B-tcp", "B-hybrid", "B-agg", "B-slo")
# The workload shapes (`--shape`): the conversation trace, or long prompts with short outputs
# (1,024-2,048 prompt and 16-32 output tokens, Poisson arrivals), where prefill dominates.
SHAPES = ("trace", "long-prompt")
LONG_PROMPT = dict(kind="random", arrival="poisson", prompt_mean=1536, output_mean=24, range_ratio=1 / 3)
PLAN_PREFIX = "B*-"   # B*-<name>: the cluster `pdserve plan` picked for an SLO pair (--plan NAME=DIR)
_PLAN_NAME = re.compile(r"(tight|loose)(-[a-z0-9]+)?")


def plan_pair(name: str) -> str:
    """The SLO pair a --plan name was planned for: `tight` or `loose`, alone or with a variant
    (`loose-q50`: the loose plan's cluster with its router files changed, run beside it).
    ValueError for any other name."""
    match = _PLAN_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"a plan is named tight or loose, or that with a variant (loose-q50), got {name!r}")
    return match.group(1)


@dataclass(frozen=True)
class CompareConfig:
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
    host_check_s: float = 2.0  # before each run, every core computes a fixed product this long: the run's machine speed (0: off)
    seed: int = 0
    with_c: bool = False  # also measure C: two 1-core vLLM servers, round robin
    with_a: bool = True  # measure A, vLLM's server (False: pdserve's systems alone, compared with each other)
    pdserve_systems: tuple[str, ...] = ("B",)  # B: pdserve over `transport`; B-tcp: over tcp; B-hybrid, B-agg
    vllm_batched_tokens: tuple[int, ...] = ()  # more vLLM systems, A-<n>: A with --max-num-batched-tokens n (A*'s sweep)
    shape: str = "trace"  # SHAPES
    plans: tuple[tuple[str, Path], ...] = ()  # (plan name, dir): B*-<name> runs the cluster `pdserve plan` wrote there
    transport: str = "auto"  # B's KV transport (auto: shared memory on one host)
    budget_s: float = 19 * 60.0  # the whole run, report included
    start_estimate_s: float = 45.0  # per server brought up (vLLM or a pdserve cluster)
    run_overhead_s: float = 20.0  # per run beyond its arrivals: warm-up, the last requests' tail, quiet check
    report_reserve_s: float = 30.0  # kept for writing the report and plots
    colocated_cores: str = "0-1"
    prefill_cores: str = "0"
    decode_cores: str = "1"
    model_dir: Path = Path("models/bench")
    trace_path: Path | None = None  # default: <repo>/../shared/data/traces/AzureLLMInferenceTrace_conv.csv
    out_dir: Path = Path("bench/results")
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
        unknown = set(self.pdserve_systems) - set(PDSERVE_SYSTEMS)
        if unknown or not (self.pdserve_systems or self.plans):
            raise ValueError(f"pdserve systems must be among {', '.join(PDSERVE_SYSTEMS)}, got "
                             f"{', '.join(self.pdserve_systems) or 'none'}")
        if self.shape not in SHAPES:
            raise ValueError(f"the workload shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        names = [name for name, _ in self.plans]
        for name in names:
            plan_pair(name)
        if len(set(names)) != len(names):
            raise ValueError(f"--plan names each plan at most once, got {', '.join(names)}")
        if any(n < 32 for n in self.vllm_batched_tokens):
            raise ValueError(f"max_num_batched_tokens of an A-<n> system must be >= 32, got {self.vllm_batched_tokens}")
        if self.host_check_s < 0:
            raise ValueError(f"host_check_s must be >= 0 (0: no speed check), got {self.host_check_s}")
        if not self.budget_s > self.report_reserve_s:
            raise ValueError(f"the time budget ({self.budget_s:g} s) must exceed the report's reserve "
                             f"({self.report_reserve_s:g} s): raise --budget-min")

    @property
    def slo_pairs(self) -> tuple[SLOPair, ...]:
        return (SLOPair("tight", SLO(ttft_s=self.ttft_slo_s, tpot_s=self.tpot_tight_s)),
                SLOPair("loose", SLO(ttft_s=self.ttft_slo_s, tpot_s=self.tpot_loose_s)))

    def pair(self, name: str) -> SLOPair:
        """The SLO pair called `name` ("tight" or "loose")."""
        found = [pair for pair in self.slo_pairs if pair.name == name]
        if not found:
            raise ValueError(f"no SLO pair {name!r}; the pairs are {', '.join(p.name for p in self.slo_pairs)}")
        return found[0]

    @property
    def systems(self) -> tuple[str, ...]:
        return (*(("A",) if self.with_a else ()), *(f"A-{n}" for n in self.vllm_batched_tokens), *self.pdserve_systems,
                *(PLAN_PREFIX + pair for pair, _ in self.plans), *(("C",) if self.with_c else ()))

    def transport_of(self, system: str) -> str:
        """The KV transport of a pdserve system."""
        return "tcp" if system == "B-tcp" else self.transport

    def topology_of(self, system: str) -> str:
        return {"B-hybrid": "hybrid", "B-agg": "aggregated"}.get(system, "disaggregated")

    def router_flags_of(self, system: str) -> tuple[str, ...]:
        """The SLO-driven systems' routers get the tight SLO pair to place and admit by (no
        admission slack beyond the policy's default); B and B-tcp run as before, with no SLO."""
        if system not in ("B-hybrid", "B-agg", "B-slo"):
            return ()
        return ("--slo-ttft-ms", f"{self.ttft_slo_s * 1000:g}", "--slo-tpot-ms", f"{self.tpot_tight_s * 1000:g}")

    def engine_settings(self) -> EngineSettings:
        """Prefix caching off: a re-measured (noisy) run resends the same prompts, which must not hit
        the cache; the trace's random-token prompts share no prefixes anyway. The dtype is what
        `pdserve up --dtype auto` and `pdserve profile` run here (measured once per host kind, with
        one worker's cores), for every system: a plan's profile and the cluster it sizes must
        compute alike, and A must not run a dtype pdserve would not."""
        from pdserve.dtype_probe import resolve_auto_dtype

        measurable = (Path(self.model_dir) / "config.json").is_file()   # else EngineSettings' guess, vLLM's error
        dtype = resolve_auto_dtype(str(self.model_dir), self.prefill_cores).dtype if measurable else "auto"
        return EngineSettings(model=str(self.model_dir), dtype=dtype, max_model_len=self.max_model_len,
                              kv_cache_bytes=self.kv_cache_mib << 20, max_num_seqs=self.max_num_seqs, seed=self.seed,
                              enable_prefix_caching=False)

    def speed_product(self) -> str:
        """The product the speed check before each run times: the engines' dtype's, so that a
        change in the arithmetic they compute in is seen (`loadgen.host_probe.product_for_dtype`)."""
        from loadgen.host_probe import product_for_dtype

        return product_for_dtype(self.engine_settings().dtype)


QUICK = dict(rates_rps=(0.5, 1.0, 2.0), num_requests=16, warmup_requests=2, noisy_retries=0,  # --quick: a smoke run
             budget_s=6 * 60.0, label="goodput_vs_vllm_quick", cdf_rates_rps=(1.0,))


def schedule(num_rates: int, systems: tuple[str, ...] = ("A", "B")) -> list[tuple[str, int]]:
    """(system, rate index) in ABBA order: A,B at rate 0, B,A at rate 1, ... (A,B,C then C,B,A with
    three) so each rate costs one server switch and all systems are measured close in time."""
    return [(key, i) for i in range(num_rates) for key in (systems if i % 2 == 0 else systems[::-1])]


def workload(config: CompareConfig, rate_rps: float) -> list[RequestSpec]:
    """The same `num_requests` trace requests at every rate, their gaps rescaled so the last arrives
    at num_requests / rate_rps; or for the long-prompt shape the same lengths at every rate, in
    Poisson arrivals of the same seed (the gaps scale with the rate)."""
    if config.shape == "long-prompt":
        return WorkloadConfig(**LONG_PROMPT, num_requests=config.num_requests, seed=config.seed).build(rate_rps=rate_rps)
    return WorkloadConfig(kind="trace", arrival="trace", rate_rps=None, trace_path=config.trace_path,
                          max_prompt_tokens=config.max_prompt_tokens, max_output_tokens=config.max_output_tokens,
                          num_requests=config.num_requests).build(rate_rps=rate_rps)


def prompts_for(config: CompareConfig, rate_index: int, vocab_size: int) -> PromptSynthesizer:
    """The same token ids for every system at one rate; another set at each rate (no cross-run cache hits)."""
    return PromptSynthesizer(seed=config.seed * 1000 + rate_index, token_id_low=10, token_id_high=vocab_size - 10)
