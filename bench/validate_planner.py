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
from pathlib import Path

from rich.console import Console

from loadgen.harness import WorkloadConfig, make_target, run_with_progress
from loadgen.metrics import SLO, summarize
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig
from planner.profile import Profile, load_profile
from planner.validation import error_table
from planner.validation_runs import (RateRun, ValidationSetup, as_sent, auto_rates, cluster_cpu_s, compare,
                                     load_earlier, write_validation)

REPO = Path(__file__).resolve().parent.parent


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if args.resimulate:
        setup, runs = load_earlier(args.resimulate / "validation.json", args.transport)
    else:
        slo = SLO(ttft_s=args.ttft_slo_ms / 1e3, tpot_s=args.tpot_slo_ms / 1e3)
        workload = {"input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio}
        setup = ValidationSetup(args.model.name, slo, workload, args.transport)
        runs = measure(args, load_profile(args.profile[0]), slo, console)
    comparisons = compare(runs, args.profile, setup.transport, setup.slo)
    console.print(error_table(comparisons, f"measured vs simulated, 1P+1D, {setup.model_name}"))
    json_path, png = write_validation(args.out_dir, setup, args.profile, runs, comparisons, args.resimulate)
    console.print(f"wrote {json_path} and {png}")
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


def first_vocab(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["vocab_size"])


if __name__ == "__main__":
    sys.exit(main())
