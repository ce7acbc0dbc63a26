"""Goodput of pdserve (1 prefill + 1 decode worker, one core each) against vLLM's own OpenAI
server colocated on the same two cores, on the Azure conversation trace. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from launch.comparison_systems import PdserveCluster, VllmServers
from loadgen.comparison.admission import AdmissionSampler
from loadgen.comparison.budget import Budget, estimate_run_s, quiet_wait_s, skip_reason
from loadgen.comparison.config import PLAN_PREFIX, QUICK, CompareConfig, plan_pair, prompts_for, schedule, workload
from loadgen.comparison.goodput import Measurement, Skipped, settled
from loadgen.comparison.report import report
from loadgen.harness import run_with_progress
from loadgen.host_probe import speed_check_ms, wake_check_us
from loadgen.metrics import summarize
from loadgen.proc_cpu import OtherLoad, wait_for_quiet
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig
from loadgen.workload import RequestSpec
from pdserve.cpu_placement import parse_cores
from planner.router_config import read_planned_cluster

DESCRIPTION = """\
Side by side, in one run, on the same two cores and the same `bench` model:
  A  vLLM's own OpenAI server, colocated: one engine on both cores (VLLM_CPU_OMP_THREADS_BIND=0-1)
  B  pdserve: 1 prefill worker on core 0 + 1 decode worker on core 1 (LocalCluster), KV over
     --transport (default auto: shared memory, one-sided, on one host)
  B-tcp (--systems A,B,B-tcp) the same cluster with KV over tcp: the transport's share, side by side
  B-hybrid the same pools, topology hybrid: the router places each request (a decode worker may
     prefill it) by the tight SLO pair, and refuses what it predicts cannot meet the TTFT SLO
  B-agg  one aggregated pdserve worker on both cores (the router in front of one engine)
  A-<n>  A with --max-num-batched-tokens n (vLLM's CPU server default: 2048): --systems A,A-512,A-1024,B
     sweeps it; the best of A and the A-<n> per SLO pair is A* (the issue's "vLLM at its best")
  B-slo  B with the tight SLO pair given to its router: admission refuses at once what it predicts
     cannot meet the TTFT SLO (bench/overload.py measures it past its knee)
  B*-<pair> (--plan PAIR=DIR) the cluster `pdserve plan --write-router-config DIR` picked for that
     SLO pair (tight or loose): its topology and pool sizes on the same two cores, its router files
     (cost model, placement policy) and SLOs; the report sets the plan's predicted goodput beside it;
     --plan loose-VARIANT=DIR2 runs a copy of a plan (its placement.json changed, say) beside it
  C  (--with-c) two vLLM servers, one per core, requests dealt round robin: one core per engine
     like B, without disaggregation
Workload: one fixed request set, the first N requests of the Azure LLM inference conversation
trace (lengths capped to the context), replayed at every offered rate with the trace's arrival
gaps rescaled to that rate (its burstiness is kept; N / rate seconds of arrivals): the rate is the
only thing that changes between runs. With --shape long-prompt the request set is instead
1,024-2,048 prompt and 16-32 output tokens (uniform, fixed seed) in Poisson arrivals: prefill-heavy.
Prompts are token ids, identical for all systems at a given rate (a fresh set of ids per rate); prefix caching is off in every system (a re-measured run
resends its prompts), and every request generates exactly its trace output length.

For every rate the systems are measured one after the other (ABBA order: A,B at the first rate,
B,A at the next, ...; with C: A,B,C then C,B,A), so machine noise hits all; only one system is up
at a time, and each run starts with uncounted warm-up requests, after waiting up to 45 s for other
processes to go quiet and timing a fixed matrix product in the engines' dtype on every core for
2 s (the machine's speed, which moves on a shared VM: each run's is reported against the run's
median) and a cross-core wake-up round trip (what every hop of a request pays; recorded per run). A request
is good when it meets the TTFT SLO and the TPOT SLO; two SLO pairs share one TTFT SLO, with a
tight and a loose TPOT. Goodput = the offered rate at which SLO
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


def measure(system, rate_rps: float, specs: list[RequestSpec], prompts: PromptSynthesizer,
            config: CompareConfig, title: str, restarted: bool, budget: Budget) -> Measurement | None:
    """One run after waiting for a quiet machine; a noisy run (other processes above
    `quiet_cores`) is measured again up to `noisy_retries` times while the budget allows, and the
    quietest attempt kept. A run still going when the budget (less the report's reserve) ends is
    cut; None when no attempt finished."""
    run_config = RunConfig(warmup_requests=config.warmup_requests, request_timeout_s=config.request_timeout_s)
    need_s = estimate_run_s(config, rate_rps)
    cores, product = sorted(parse_cores(config.colocated_cores)), config.speed_product()
    attempts: list[Measurement] = []
    while len(attempts) <= config.noisy_retries:
        if attempts and skip_reason(config, budget.remaining_s(), need_s) is not None:
            break  # no time to re-measure: keep the noisy attempt
        wait_for_quiet(config.quiet_cores, quiet_wait_s(config, budget.remaining_s(), need_s))
        host_ms, wake_us = ((speed_check_ms(cores, config.host_check_s, product=product), wake_check_us(cores))
                            if config.host_check_s else (None, None))
        other = OtherLoad.start()
        kv_cpu_before_s = _kv_producer_cpu_s(system)
        suffix = f" retry (noise {attempts[-1].other_load_cores:.1f} cores)" if attempts else ""
        sampler = _admission_sampler(system)
        running = run_with_progress(system.target(), specs, prompts, run_config, title + suffix)
        try:
            result = asyncio.run(asyncio.wait_for(running, budget.remaining_s() - config.report_reserve_s))
        except TimeoutError:
            other.stop()
            if sampler is not None:
                sampler.stop()
            break
        other_cores = other.stop()
        admission = sampler.stop() if sampler is not None else ()
        kv_cpu_s = None if kv_cpu_before_s is None else _kv_producer_cpu_s(system) - kv_cpu_before_s
        summaries = {p.name: summarize(result.records, result.duration_s, p.slo) for p in config.slo_pairs}
        attempts.append(Measurement(system.key, rate_rps, result, summaries, other_cores, restarted, len(attempts) + 1,
                                    kv_cpu_s, host_ms, product, wake_us, admission))
        if other_cores <= config.quiet_cores:
            break
    return min(attempts, key=lambda m: m.other_load_cores) if attempts else None


def _admission_sampler(system) -> AdmissionSampler | None:
    """A started sampler of the router's admission calibration, for pdserve systems (None for vLLM's):
    its times count from just before the load generator's start, within milliseconds of the run's."""
    url = getattr(system, "router_metrics_url", lambda: None)()
    return None if url is None else AdmissionSampler(url).start()


def _kv_producer_cpu_s(system) -> float | None:
    reader = getattr(system, "kv_producer_cpu_s", None)  # pdserve systems only
    return None if reader is None else reader()


def make_systems(config: CompareConfig, log_dir: Path) -> dict:
    settings = config.engine_settings()
    systems = {"A": VllmServers.colocated(settings, config.colocated_cores, log_dir)}
    for tokens in config.vllm_batched_tokens:
        systems[f"A-{tokens}"] = VllmServers.colocated(replace(settings, max_num_batched_tokens=tokens),
                                                       config.colocated_cores, log_dir, key=f"A-{tokens}")
    for key in config.pdserve_systems:
        systems[key] = PdserveCluster.fixed(settings, config.prefill_cores, config.decode_cores, log_dir,
                                            config.transport_of(key), key, config.topology_of(key),
                                            config.router_flags_of(key))
    for pair, directory in config.plans:
        key = PLAN_PREFIX + pair
        plan = read_planned_cluster(directory)
        topology = plan.topology
        planned = replace(settings, max_num_batched_tokens=topology.token_budget or settings.max_num_batched_tokens)
        systems[key] = PdserveCluster.sized(planned, config.prefill_cores, config.decode_cores, log_dir,
                                            config.transport, key, topology.kind, topology.num_prefill,
                                            topology.num_decode + topology.num_colocated, tuple(plan.router_flags()),
                                            topology.devices_per_instance)
    if config.with_c:
        systems["C"] = VllmServers.pair(settings, (config.prefill_cores, config.decode_cores), log_dir)
    return systems


def run_all(config: CompareConfig, console: Console, budget: Budget) -> tuple[list[Measurement], list[Skipped]]:
    """Every (system, rate) run in ABBA order, one system up at a time, until a system is
    `settled`; a system found dead between runs is restarted (its next measurement says so).
    Points that do not fit the time budget, or were cut by it, are returned as skipped."""
    from pdserve.make_model import build_model

    model_dir = build_model("bench", config.model_dir)  # cached: returns at once when already built
    vocab_size = vocab_size_of(model_dir)
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
            current = switch_to(current, wanted, console) if switch else current
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


def switch_to(current, wanted, console: Console):
    if current is not None:
        current.stop()
    started = time.monotonic()
    with console.status(f"starting {wanted.label} ..."):
        wanted.start()
    console.print(f"{wanted.label}: up in {time.monotonic() - started:.0f} s")
    return wanted


def vocab_size_of(model_dir: Path) -> int:
    import json

    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def parse_args(argv: list[str] | None) -> CompareConfig:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rates, shorter runs, no re-runs (~5 min): a smoke run")
    parser.add_argument("--rates", type=lambda s: tuple(float(r) for r in s.split(",")),
                        help="offered rates, req/s, comma-separated ascending (default 0.25,0.5,0.75,1,1.5,2,2.5,3)")
    parser.add_argument("--num-requests", type=int, help="the first N trace requests, replayed at every rate (default 30)")
    parser.add_argument("--budget-min", type=float, help="the whole run fits in this many minutes (default 19; --quick 6)")
    parser.add_argument("--with-c", action="store_true",
                        help="also measure C: two 1-core vLLM servers, round robin (~10 more minutes: pass --budget-min 30)")
    parser.add_argument("--systems", type=lambda s: tuple(s.split(",")),
                        help="the systems, comma-separated, A first, among A,B,B-tcp,B-hybrid,B-agg,B-slo (default A,B)")
    parser.add_argument("--transport", choices=("auto", "shm", "tcp", "torch"),
                        help="B's KV transport (default auto: shm on one host)")
    parser.add_argument("--ttft-slo-ms", type=float, help="TTFT SLO (default 1500)")
    parser.add_argument("--tpot-tight-ms", type=float, help="tight TPOT SLO (default 30)")
    parser.add_argument("--tpot-loose-ms", type=float, help="loose TPOT SLO (default 60)")
    parser.add_argument("--trace", type=Path, help="Azure trace CSV (default <repo>/../shared/data/traces/...conv.csv)")
    parser.add_argument("--out-dir", type=Path, help="where results go (default bench/results)")
    parser.add_argument("--label", help="file name stem (default goodput_vs_vllm, or goodput_vs_vllm_quick)")
    parser.add_argument("--seed", type=int, help="prompt seed (default 0)")
    parser.add_argument("--shape", choices=("trace", "long-prompt"),
                        help="the workload: the conversation trace (default), or long-prompt: 1,024-2,048 prompt "
                             "and 16-32 output tokens, Poisson arrivals (plan B* with `pdserve plan --workload random "
                             "--input-len 1536 --output-len 24 --range-ratio 0.333`)")
    parser.add_argument("--plan", action="append", type=_plan, metavar="PAIR=DIR", default=[],
                        help="also run B*-PAIR: the cluster `pdserve plan --write-router-config DIR` picked for the "
                             "SLO pair PAIR (tight or loose; plan with this run's SLOs and workload); repeatable. "
                             "PAIR-VARIANT (loose-q50=DIR2) runs another copy of a plan, e.g. with its router's "
                             "placement.json changed, as B*-loose-q50 beside B*-loose")
    parser.add_argument("--host-check-s", type=float, default=None,
                        help="before each run, time a fixed matrix product in the engines' dtype on every core for "
                             "this long, and a cross-core wake-up round trip, and record both with the run "
                             "(default 2; 0: off). bench/host_speed.py and loadgen/host_probe.py explain why")
    args = parser.parse_args(argv)
    given = {name: value for name, value in (
        ("host_check_s", args.host_check_s),
        ("rates_rps", args.rates), ("num_requests", args.num_requests), ("trace_path", args.trace),
        ("budget_s", None if args.budget_min is None else args.budget_min * 60), ("with_c", args.with_c or None),
        ("pdserve_systems", _pdserve_systems(parser, args.systems)), ("transport", args.transport),
        ("vllm_batched_tokens", _vllm_batched_tokens(parser, args.systems)),
        ("out_dir", args.out_dir), ("label", args.label), ("seed", args.seed), ("plans", tuple(args.plan) or None),
        ("shape", args.shape),
        ("ttft_slo_s", _s(args.ttft_slo_ms)), ("tpot_tight_s", _s(args.tpot_tight_ms)),
        ("tpot_loose_s", _s(args.tpot_loose_ms))) if value is not None}
    try:
        return CompareConfig(**((QUICK if args.quick else {}) | given))
    except ValueError as bad:
        parser.error(str(bad))


def _pdserve_systems(parser, systems: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """--systems as CompareConfig takes it: A first, then pdserve's, C only through --with-c."""
    if systems is None:
        return None
    if systems[0] != "A" or "C" in systems:
        parser.error(f"--systems starts with A (the baseline) and leaves C to --with-c, got {','.join(systems)}")
    return tuple(s for s in systems[1:] if not s.startswith("A-"))


def _vllm_batched_tokens(parser, systems: tuple[str, ...] | None) -> tuple[int, ...] | None:
    """The n of every A-<n> in --systems (vLLM with --max-num-batched-tokens n)."""
    tokens = []
    for system in systems or ():
        if system.startswith("A-"):
            if not system[2:].isdigit():
                parser.error(f"an A-<n> system names vLLM's --max-num-batched-tokens n, got {system}")
            tokens.append(int(system[2:]))
    return tuple(tokens) or None


def predictions(config: CompareConfig) -> dict[str, tuple[str, str, float, str]]:
    """B*-<name> -> (the SLO pair it was planned for, the plan's topology, its predicted goodput,
    `request_set_mismatch` of its workload against this run's), for the report."""
    plans = {name: read_planned_cluster(directory) for name, directory in config.plans}
    return {PLAN_PREFIX + name: (plan_pair(name), plan.topology.label, plan.predicted_goodput_rps,
                                 request_set_mismatch(plan.workload, config.num_requests))
            for name, plan in plans.items()}


def request_set_mismatch(plan_workload: str, num_requests: int) -> str:
    """"" when the plan was made for as many requests as this run sends (or its workload does not
    say), else why its prediction is not one of this run: the goodput bar is an attainment over the
    request set, and another set holds another share of the prompts a topology may give up (the
    trace's first 80 requests hold 7 of 2,000 tokens, 8.75%, which a plan at 90% can lose
    whole; its first 40 hold 5, 12.5%, which it cannot)."""
    found = re.search(r"(\d+) requests", plan_workload)
    if found is None or int(found.group(1)) == num_requests:
        return ""
    return f"planned for {found.group(1)} requests, measured on {num_requests}"


def _plan(text: str) -> tuple[str, Path]:
    """NAME=DIR (NAME: tight, loose, or either with a variant, loose-q50), DIR holding the
    cluster.json `pdserve plan --write-router-config` writes."""
    name, sep, directory = text.partition("=")
    try:
        if not sep:
            raise ValueError("no =DIR")
        plan_pair(name)
        read_planned_cluster(Path(directory))
    except ValueError as bad:
        raise argparse.ArgumentTypeError(f"expected tight=DIR or loose=DIR (or loose-VARIANT=DIR), got {text!r}: "
                                         f"{bad}") from bad
    return name, Path(directory)


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)  # tables stay readable in a log
    for system, (_, _, _, mismatch) in predictions(config).items():
        if mismatch:
            console.print(f"[yellow]{system}: {mismatch}: its predicted goodput is not a prediction of this run "
                          f"(plan with --num-prompts {config.num_requests})[/yellow]")
    budget = Budget(config.budget_s)
    started = time.monotonic()
    measurements, skipped = run_all(config, console, budget)
    report(config, measurements, console, wall_s=time.monotonic() - started, argv=sys.argv, skipped=skipped,
           predicted=predictions(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
