"""Where a small host's unbound processes run, and what it costs the decode worker.

A 1P+1D cluster binds each worker's processes to its own core. Bound to nothing, the router and the
client would go wherever Linux puts them: the planner's host model gives their load to whichever
core no engine steps on, but a one-core worker's vLLM processes poll each other (`sched_yield`, up to
--vllm-spin-ms after every message), so to the load balancer an idle prefill core looks busy and
they land on the decode core too. `pdserve up` now binds the router to the prefill workers' cores. This runs the same workload on the same cluster under
several variants, one after another (ABBA), and prints each request's phases
(`planner.validation_phases`: queue, prefill with its hops, the first gap, the steady decode
gap), TTFT/TPOT, and the CPU each process group and each core used:

  floating   the router and the client on any core (`pdserve up --router-cores ''`);
  router     the router on the prefill worker's core (`pdserve up`'s default), the client anywhere;
  pinned     the router and the client on the prefill worker's core;
  spinN      the workers' vLLM spin capped at N ms (e.g. spin5; the router as `router`);
  spinvllm   vLLM's own spin (1 s), as vLLM's server runs.
Redis is bound to nothing in each (it idles: a registry refresh a second).

--topology aggregated runs one worker over both cores instead (what `pdserve plan` calls 1Cx2), with
the KV cache of both; the router has no core to itself there (router and pinned are refused).

    python bench/unbound_placement.py --model models/tiny --shape short-long --rate 6.3 \\
        --variants floating,router,pinned --out bench/results/unbound_placement_epyc

Writes OUT/unbound_placement.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from loadgen.comparison.prefix_routing import abba
from loadgen.comparison.unbound import Variant, parse_variant, variant_medians
from loadgen.harness import run_with_progress
from loadgen.metrics import SLO, summarize
from loadgen.proc_cpu import core_busy_shares, cpu_seconds, per_core_ticks, process_tree
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig
from planner.evaluate import p50_p90
from planner.validation_phases import PHASE_TITLES, PHASES, measured_phases
from planner.validation_shapes import SHAPE_NAMES, validation_shapes

REPO = Path(__file__).resolve().parent.parent

PREFILL_CORE, DECODE_CORE = "0", "1"


def run_variant(args, variant: Variant, specs) -> dict:
    from launch.comparison_systems import PdserveCluster
    from pdserve.engine import EngineSettings

    engine = EngineSettings(model=str(args.model), max_model_len=args.max_model_len, enable_prefix_caching=False,
                            kv_cache_bytes=args.kv_cache_mb << 20)
    if variant.spin_ms is not None:
        engine = replace(engine, vllm_spin_ms=variant.spin_ms)
    system = PdserveCluster.fixed(engine, PREFILL_CORE, DECODE_CORE, args.out / "logs", args.transport, variant.name,
                                  topology=args.topology)
    system.spec = replace(system.spec, router_cores=None if variant.router_on_prefill else "")
    mine = os.sched_getaffinity(0)
    system.start()
    try:
        cluster = system.cluster
        worker_cpu = lambda role: sum(cpu_seconds(process_tree(cluster.workers[w].pid))  # noqa: E731
                                      for w in cluster.worker_ids(role))
        groups = {"prefill worker": lambda: worker_cpu("prefill"), "decode worker": lambda: worker_cpu("decode"),
                  "router": lambda: cpu_seconds(process_tree(cluster.router.pid)),
                  "redis": lambda: cpu_seconds([cluster.redis.process.pid]),
                  "client": lambda: time.process_time()}
        if variant.client_on_prefill:
            os.sched_setaffinity(0, {int(PREFILL_CORE)})
        cpu_before, cores_before, started = {k: f() for k, f in groups.items()}, \
            per_core_ticks(Path("/proc/stat").read_text()), time.perf_counter()
        result = asyncio.run(run_with_progress(system.target(), specs, PromptSynthesizer(seed=args.seed, token_id_high=250),
                                               RunConfig(warmup_requests=4), f"{variant.name} {args.rate:g} req/s"))
        wall_s = time.perf_counter() - started
        cpu = {k: (f() - cpu_before[k]) / wall_s for k, f in groups.items()}
        busy = core_busy_shares(cores_before, per_core_ticks(Path("/proc/stat").read_text()))
    finally:
        os.sched_setaffinity(0, mine)
        system.stop()
    summary = summarize(result.records, result.duration_s, SLO(ttft_s=args.ttft_slo_ms / 1e3, tpot_s=args.tpot_slo_ms / 1e3))
    phases = measured_phases(result.records, len(specs))
    row = {"variant": variant.name, "ok": summary["completed"], "failed": summary["failed"],
           "ttft_p50_ms": summary["median_ttft_ms"], "ttft_p90_ms": summary["p90_ttft_ms"],
           "tpot_p50_ms": summary["median_tpot_ms"], "tpot_p90_ms": summary["p90_tpot_ms"],
           "slo_attainment": summary["slo_attainment"], "cpu_cores": cpu, "core_busy": busy,
           "phases_ms": {}}
    for phase in PHASES:
        p50, p90 = p50_p90(np.asarray(phases[phase], dtype=float))
        row["phases_ms"][phase] = [None if p50 is None else p50 * 1e3, None if p90 is None else p90 * 1e3]
    return row


def report(summary: dict[str, dict], args, console: Console) -> list[str]:
    table = Table(title=f"{args.model.name} {label(args)}, {args.shape} at {args.rate:g} req/s: median of runs")
    columns = ["variant", "TTFT p50/p90 ms", "TPOT p50/p90 ms", *(PHASE_TITLES[p] + " p50/p90 ms" for p in PHASES),
               "cores busy (0 / 1)", "CPU cores: prefill, decode, router, redis, client"]
    for column in columns:
        table.add_column(column)
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    fmt = lambda pair: "/".join("-" if v is None else f"{v:.1f}" for v in pair)  # noqa: E731
    for name, s in summary.items():
        cells = [f"{name} ({s['runs']})", fmt((s["ttft_p50_ms"], s["ttft_p90_ms"])), fmt((s["tpot_p50_ms"], s["tpot_p90_ms"])),
                 *(fmt(s["phases_ms"][p]) for p in PHASES),
                 " / ".join(f"{s['core_busy'].get(f'cpu{i}', 0):.0%}" for i in (0, 1)),
                 ", ".join(f"{v:.2f}" for v in s["cpu_cores"].values())]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return lines


def label(args) -> str:
    return f"1P+1D ({args.transport})" if args.topology == "disaggregated" else "1Cx2 (one worker over both cores)"


def plot(summary: dict[str, dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PHASES), figsize=(4 * len(PHASES), 3.8))
    names = list(summary)
    for ax, phase in zip(axes, PHASES):
        p50 = [summary[n]["phases_ms"][phase][0] or 0 for n in names]
        p90 = [summary[n]["phases_ms"][phase][1] or 0 for n in names]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], p50, 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], p90, 0.4, label="p90")
        ax.set_xticks(list(x), names)
        ax.set_title(PHASE_TITLES[phase])
        ax.set_ylabel("ms")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="checkpoint the workers serve (e.g. models/tiny)")
    p.add_argument("--shape", choices=SHAPE_NAMES, default="short-long", help="workload shape (default short-long)")
    p.add_argument("--rate", type=float, required=True, help="offered requests per second")
    p.add_argument("--num-requests", type=int, default=200, help="requests per run (default 200)")
    p.add_argument("--variants", default="floating,router,pinned",
                   help="comma-separated: floating, router, pinned, spinN, spinvllm (default floating,router,pinned)")
    p.add_argument("--rounds", type=int, default=1,
                   help="ABBA rounds: each runs the variants in order, then in reverse (default 1: two runs each)")
    p.add_argument("--transport", default="tcp", choices=["tcp", "shm", "torch"], help="KV transport (default tcp)")
    p.add_argument("--topology", default="disaggregated", choices=["disaggregated", "aggregated"],
                   help="1P+1D, or one aggregated worker over both cores (default disaggregated)")
    p.add_argument("--max-model-len", type=int, default=2048, help="the engines' context (default 2048)")
    p.add_argument("--kv-cache-mb", type=int, default=256, help="each worker's KV cache, MiB (default 256)")
    p.add_argument("--ttft-slo-ms", type=float, default=200.0, help="TTFT SLO for the attainment column (default 200)")
    p.add_argument("--tpot-slo-ms", type=float, default=20.0, help="TPOT SLO for the attainment column (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "out" / "unbound_placement", help="output directory")
    args = p.parse_args(argv)
    try:
        args.variant_list = [parse_variant(v) for v in args.variants.split(",") if v.strip()]
    except ValueError as error:
        p.error(str(error))
    if os.cpu_count() is None or len(os.sched_getaffinity(0)) < 2:
        p.error("this needs two cores: one per worker")
    if args.topology == "aggregated" and any(v.client_on_prefill or v.name == "router" for v in args.variant_list):
        p.error("router and pinned need a core apart from the decode worker's: the aggregated worker takes both")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    shape = validation_shapes(args.max_model_len)[args.shape]
    specs = shape.workload.build(rate_rps=args.rate, num_requests=args.num_requests)
    rows, variants = [], {v.name: v for v in args.variant_list}
    for name, _ in abba(list(variants), args.rounds):
        console.rule(name)
        rows.append(run_variant(args, variants[name], specs))
    summary = variant_medians(rows, PHASES)
    lines = report(summary, args, console)
    (args.out / "unbound_placement.json").write_text(json.dumps(
        {"model": args.model.name, "shape": args.shape, "rate_rps": args.rate, "num_requests": args.num_requests,
         "transport": args.transport, "topology": args.topology, "runs": rows, "summary": summary}, indent=1))
    (args.out / "unbound_placement.md").write_text("\n".join(lines) + "\n")
    png = plot(summary, args.out / "unbound_placement.png",
               f"{args.model.name} {label(args)}, {args.shape} at {args.rate:g} req/s: phases by variant")
    console.print(f"wrote {args.out}/unbound_placement.{{json,md}} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
