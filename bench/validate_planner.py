"""Do the planner's predictions hold? Run the real cluster under loadgen at several rates and compare
measured with simulated p50/p90 TTFT and TPOT and SLO attainment, per profile.

    python bench/validate_planner.py --model models/tiny --profile planner/profiles/tiny_2cpu_served.json \\
        --profile planner/profiles/tiny_2cpu.json --rates 4,12,20,28,36,44 --duration-s 45

One real 1P+1D cluster (prefill on core 0, decode on core 1, the engine settings of the first
profile) serves a Poisson workload at each rate; the very same request list (arrivals and
lengths) is simulated through 1P+1D with each profile's fitted model. Prints a table of
measured / simulated values and errors, and writes <out-dir>/validation.json and .png.
Without --rates, the rates are 30/60/90/120% of the first profile's simulated goodput.

validation.json keeps each rate's requests as sent, so a change to the simulator or the model can
be checked against the same real runs without running the cluster again:

    python bench/validate_planner.py --resimulate bench/results/validate_planner \\
        --profile planner/profiles/tiny_2cpu_served.json --out-dir out/resimulated
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402

from loadgen.harness import WorkloadConfig, make_target, run_with_progress  # noqa: E402
from loadgen.metrics import SLO, summarize  # noqa: E402
from loadgen.prompts import PromptSynthesizer  # noqa: E402
from loadgen.runner import RunConfig  # noqa: E402
from loadgen.workload import RequestSpec  # noqa: E402
from planner.evaluate import make_attainment_fn  # noqa: E402
from planner.perf_model import fit_perf_model  # noqa: E402
from planner.profile import Profile, load_profile  # noqa: E402
from planner.search import SearchSettings, max_rate  # noqa: E402
from planner.simulator import SimSettings, Topology, simulate  # noqa: E402
from planner.validation import Comparison, error_table, plot_validation, to_json  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="checkpoint the cluster serves (the profiles' model); "
                   "required unless --resimulate")
    p.add_argument("--resimulate", type=Path, metavar="DIR",
                   help="no cluster: simulate the requests of DIR/validation.json (an earlier run) with --profile "
                        "and compare with what that run measured")
    p.add_argument("--profile", type=Path, action="append", required=True,
                   help="profile to simulate with; repeat to compare several (e.g. --through engine and cluster)")
    p.add_argument("--rates", help="comma-separated offered rates, req/s (default: from the first profile)")
    p.add_argument("--duration-s", type=float, default=60.0, help="seconds of arrivals per rate (default 60)")
    p.add_argument("--min-requests", type=int, default=40, help="at least this many requests per rate (default 40)")
    p.add_argument("--input-len", type=int, default=128, help="mean prompt tokens (default 128)")
    p.add_argument("--output-len", type=int, default=64, help="mean output tokens (default 64)")
    p.add_argument("--range-ratio", type=float, default=0.5, help="lengths uniform in mean x (1 +- r) (default 0.5)")
    p.add_argument("--ttft-slo-ms", type=float, default=200.0, help="TTFT SLO (default 200)")
    p.add_argument("--tpot-slo-ms", type=float, default=20.0, help="TPOT SLO (default 20)")
    p.add_argument("--transport", default="tcp", choices=["tcp", "torch"], help="the cluster's KV transport")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "validate_planner")
    args = p.parse_args(argv)
    if args.model is None and args.resimulate is None:
        p.error("give --model (run the cluster) or --resimulate DIR (re-simulate an earlier run)")
    return args


def auto_rates(profile: Profile, workload: WorkloadConfig, slo: SLO, transport: str, duration_s: float,
               min_requests: int) -> list[float]:
    """30/60/90/120% of the simulated goodput, for the same run length the real runs get (a fixed
    request count would arrive all at once at high rates and never show the overload)."""
    fit = fit_perf_model(profile)
    attainment = make_attainment_fn(
        lambda rate: workload.build(rate_rps=rate, num_requests=max(min_requests, round(rate * duration_s))),
        SimSettings.from_profile(profile, transport), fit.model, slo)
    goodput, _, _ = max_rate(lambda rate: attainment(Topology.disaggregated(1, 1), rate), SearchSettings())
    if goodput <= 0:
        raise SystemExit("the first profile meets the SLOs at no rate; give --rates or looser SLOs")
    return [round(goodput * share, 3) for share in (0.3, 0.6, 0.9, 1.2)]


def start_cluster(model: Path, profile: Profile, transport: str, log_dir: Path):
    from pdserve.engine import EngineSettings
    from launch.local import ClusterSpec, LocalCluster

    # No prefix cache: the simulator computes every prompt, so the real engines must too.
    engine = EngineSettings(model=str(model), dtype=profile.model.dtype, block_size=profile.model.block_size,
                            kv_cache_bytes=profile.engine.kv_cache_memory_bytes, max_num_seqs=profile.engine.max_num_seqs,
                            enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, transport=transport, cpu_cores={"prefill": "0", "decode": "1"},
                       log_dir=str(log_dir))
    return LocalCluster(spec).start()


@dataclass(frozen=True)
class RateRun:
    """One offered rate of a real run: the requests as sent, loadgen's summary, and the CPU the
    cluster and the client used, in cores (None when not measured)."""

    rate_rps: float
    requests: list[RequestSpec]
    measured: dict
    cluster_cpu_cores: float | None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if args.resimulate:
        earlier = json.loads((args.resimulate / "validation.json").read_text())
        if "requests" not in earlier:
            raise SystemExit(f"{args.resimulate / 'validation.json'} holds no requests (written before they were kept)")
        model_name, slo_ms, workload = earlier["model"], earlier["slo_ms"], earlier["workload"]
        transport = earlier.get("transport", args.transport)
        slo = SLO(ttft_s=slo_ms["ttft"] / 1e3, tpot_s=slo_ms["tpot"] / 1e3)
        measured = {run["rate_rps"]: run["measured"] for run in earlier["runs"]}
        cpu_cores = earlier.get("cluster_cpu_cores", {})
        runs = [RateRun(float(rate), [RequestSpec(*row) for row in rows], measured[float(rate)], cpu_cores.get(rate))
                for rate, rows in earlier["requests"].items()]
    else:
        model_name, transport = args.model.name, args.transport
        slo = SLO(ttft_s=args.ttft_slo_ms / 1e3, tpot_s=args.tpot_slo_ms / 1e3)
        workload = {"input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio}
        runs = measure(args, load_profile(args.profile[0]), slo, console)
    profiles = {path.stem: load_profile(path) for path in args.profile}
    models = {name: (SimSettings.from_profile(p, transport), fit_perf_model(p).model) for name, p in profiles.items()}
    comparisons = [Comparison(run.rate_rps, name, run.measured,
                              simulate(run.requests, Topology.disaggregated(1, 1), settings, model).summary(slo))
                   for run in runs for name, (settings, model) in models.items()]
    console.print(error_table(comparisons, f"measured vs simulated, 1P+1D, {model_name}"))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "validation.json").write_text(json.dumps(
        {"model": model_name, "profiles": [str(p) for p in args.profile], "slo_ms": slo.as_ms(), "workload": workload,
         "transport": transport, **({"resimulated": str(args.resimulate)} if args.resimulate else {}),
         **to_json(comparisons),
         "cluster_cpu_cores": {str(run.rate_rps): run.cluster_cpu_cores for run in runs},
         "requests": {str(run.rate_rps): [[round(r.arrival_s, 6), r.prompt_tokens, r.output_tokens]
                                          for r in run.requests] for run in runs}}, indent=1))
    png = plot_validation(comparisons, args.out_dir / "validation.png",
                          f"{model_name} 1P+1D: measured vs simulated (TTFT<={slo.ttft_s * 1e3:g} ms, "
                          f"TPOT<={slo.tpot_s * 1e3:g} ms)")
    console.print(f"wrote {args.out_dir / 'validation.json'} and {png}")
    return 0


def measure(args: argparse.Namespace, first: Profile, slo: SLO, console: Console) -> list[RateRun]:
    """Runs the real cluster at each rate."""
    workload = WorkloadConfig(kind="random", arrival="poisson", rate_rps=1.0, num_requests=args.min_requests,
                              prompt_mean=args.input_len, output_mean=args.output_len, range_ratio=args.range_ratio,
                              seed=args.seed)
    rates = ([float(r) for r in args.rates.split(",")] if args.rates
             else auto_rates(first, workload, slo, args.transport, args.duration_s, args.min_requests))
    console.print(f"rates {rates} req/s; SLOs TTFT {slo.ttft_s * 1e3:g} ms, TPOT {slo.tpot_s * 1e3:g} ms; "
                  f"profiles {[p.stem for p in args.profile]}")
    runs = []
    cluster = start_cluster(args.model, first, args.transport, args.out_dir / "logs")
    try:
        for index, rate in enumerate(rates):
            count = max(args.min_requests, round(rate * args.duration_s))
            specs = workload.build(rate_rps=rate, num_requests=count)
            prompts = PromptSynthesizer(seed=args.seed + index, token_id_high=min(250, first_vocab(args.model)))
            cpu_before, wall_before = cluster_cpu_s(cluster), time.perf_counter()
            result = asyncio.run(run_with_progress(make_target("pdserve", cluster.grpc_target), specs, prompts,
                                                   RunConfig(warmup_requests=4), f"{rate:g} req/s"))
            cpu_cores = (cluster_cpu_s(cluster) - cpu_before) / (time.perf_counter() - wall_before)
            measured = summarize(result.records, result.duration_s, slo)
            console.print(f"{rate:g} req/s: the cluster's processes and this client used "
                          f"{cpu_cores:.2f} of the host's {len(os.sched_getaffinity(0))} cores")
            if measured["failed"]:
                console.print(f"[red]{measured['failed']} requests failed at {rate:g} req/s: "
                              f"{measured['errors_by_kind']}[/red]")
            runs.append(RateRun(rate, as_sent(specs, result.records), measured, cpu_cores))
    finally:
        cluster.stop()
    return runs


def cluster_cpu_s(cluster) -> float:
    """CPU seconds used so far by every process of `cluster` (router, workers, vLLM's engine cores
    and model runners, their polling included: what the OS sees) and by this process (the client).
    Where it nears the host's cores the cluster is CPU-bound and the simulator's host model, which
    counts measured work and not polling, is past what it was built on."""
    from planner.profiler.serving_probe import cpu_seconds, host_cpu_seconds, process_tree

    workers = [pid for worker in cluster.workers.values() for pid in process_tree(worker.popen.pid)]
    return host_cpu_seconds(cluster.router.popen.pid) + cpu_seconds(workers)


def as_sent(specs: list[RequestSpec], records) -> list[RequestSpec]:
    """The requests as the client really sent them: a starved client sends late, and the simulator
    must see the arrivals the cluster saw, not the schedule."""
    sent = {record.index: record.sent_s for record in records}
    return [replace(spec, arrival_s=sent.get(index, spec.arrival_s)) for index, spec in enumerate(specs)]


def first_vocab(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["vocab_size"])


if __name__ == "__main__":
    sys.exit(main())
