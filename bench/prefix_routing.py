"""Prefix-aware against least-loaded routing on a shared-prefix workload. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path


from launch.commands import ClusterSpec
from launch.local import LocalCluster
from loadgen.comparison.prefix_routing import POLICIES, PrefixRun, abba, policy_medians, prefix_run
from loadgen.harness import WorkloadConfig
from loadgen.metrics import SLO
from loadgen.proc_cpu import OtherLoad, wait_for_quiet
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig, run
from loadgen.targets.pdserve_grpc import PdserveGrpcTarget
from loadgen.workload import RequestSpec
from pdserve.engine import EngineSettings
from pdserve.make_model import build_model
from pdserve.v1 import worker_pb2, worker_pb2_grpc

DESCRIPTION = """\
Two aggregated pdserve workers of the `bench` model, one core each, behind one router, with vLLM's
prefix cache on; the shared-prefix workload: --groups system prompts of --prefix-tokens tokens,
each request one of them (at random) plus a unique suffix (--suffix-mean tokens, +-66%) and
--output-tokens tokens out, Poisson arrivals at --rate. Each worker's KV cache (--kv-cache-mib)
holds about two thirds of all the prefixes: spread over both workers every prefix competes for
each cache; kept apart, each worker holds its half.

Policies (the router's placement config; the same SLOs for both):
  prefix-aware   pdserve's defaults: the router's prefix index predicts each worker's uncached
                 tokens, so a repeated prefix goes where its KV is, balanced against load
  least-loaded   the same router placing by load alone (prefill and decode balance)
Runs in ABBA order (--rounds times), fresh prefixes every run; a policy's consecutive runs share
its cluster. Measured per run: prompt tokens the engines computed (their own counters, summed over
workers) against prompt tokens sent, TTFT p50/p90, SLO attainment. Writes <out>/prefix_routing.{json,md,png}.
About 3 minutes per run plus a minute per cluster start.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1.0, help="offered requests per second (default %(default)s)")
    parser.add_argument("--num-requests", type=int, default=80, help="requests per run (default %(default)s)")
    parser.add_argument("--groups", type=int, default=16, help="distinct shared prefixes (default %(default)s)")
    parser.add_argument("--prefix-tokens", type=int, default=1536, help="tokens per shared prefix (default %(default)s)")
    parser.add_argument("--suffix-mean", type=int, default=96, help="mean unique suffix tokens (default %(default)s)")
    parser.add_argument("--output-tokens", type=int, default=32, help="mean output tokens (default %(default)s)")
    parser.add_argument("--kv-cache-mib", type=int, default=192, help="KV cache per worker (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds (each runs both policies twice)")
    parser.add_argument("--ttft-slo-ms", type=float, default=3000.0)
    parser.add_argument("--tpot-slo-ms", type=float, default=100.0)
    parser.add_argument("--model", type=Path, default=Path("models/bench"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/prefix_routing"), help="output folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = build_model("bench", args.model)
    config_dir = Path(tempfile.mkdtemp(prefix="prefix-routing-"))
    slo = SLO(ttft_s=args.ttft_slo_ms / 1000, tpot_s=args.tpot_slo_ms / 1000)
    runs: list[PrefixRun] = []
    cluster, cluster_policy = None, None
    order = abba(list(POLICIES), args.rounds)
    try:
        for step, (policy, round_index) in enumerate(order, 1):
            if policy != cluster_policy:
                if cluster is not None:
                    cluster.stop()
                cluster = _start(policy, args, model, config_dir)
                cluster_policy = policy
            result = _measure(cluster, policy, round_index, args, slo)
            runs.append(result)
            print(f"[{step}/{len(order)}] {policy} round {round_index}: computed {result.computed_share:.0%} of "
                  f"{result.prompt_tokens_sent} prompt tokens, TTFT p50 {result.ttft_p50_ms:.0f} ms p90 "
                  f"{result.ttft_p90_ms:.0f} ms, attainment {result.attainment:.0%}, refused {result.refused}, "
                  f"failed {result.failed}, "
                  f"other load {result.other_load_cores:.2f} cores", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    _report(runs, args)
    return 0


def _start(policy: str, args, model: Path, config_dir: Path) -> LocalCluster:
    config = config_dir / f"{policy}.json"
    config.write_text(json.dumps(POLICIES[policy]))
    engine = EngineSettings(model=str(model), max_model_len=4096, kv_cache_bytes=args.kv_cache_mib << 20,
                            max_num_seqs=64, enable_prefix_caching=True)
    spec = ClusterSpec(engine=engine, num_prefill=0, num_decode=2, topology="aggregated",
                       cpu_cores={"decode": "0,1"}, log_dir=str(config_dir / f"logs-{policy}"),
                       router_flags=("--placement-config", str(config), "--slo-ttft-ms", f"{args.ttft_slo_ms:g}",
                                     "--slo-tpot-ms", f"{args.tpot_slo_ms:g}"))
    started = time.monotonic()
    cluster = LocalCluster(spec).start()
    tokens = {w: _load(cluster, w).kv_blocks_total for w in cluster.workers}
    print(f"{policy}: cluster up in {time.monotonic() - started:.0f} s; KV blocks per worker {tokens}", flush=True)
    return cluster


def _load(cluster: LocalCluster, worker_id: str) -> worker_pb2.Load:
    with cluster.worker_channel(worker_id) as channel:
        return worker_pb2_grpc.WorkerStub(channel).GetLoad(worker_pb2.GetLoadRequest(), timeout=5)


def _computed(cluster: LocalCluster) -> int:
    return sum(_load(cluster, w).prompt_tokens_computed for w in cluster.workers)


def _measure(cluster: LocalCluster, policy: str, round_index: int, args, slo: SLO) -> PrefixRun:
    specs = WorkloadConfig(kind="shared-prefix", arrival="poisson", rate_rps=args.rate, num_requests=args.num_requests,
                           prompt_mean=args.suffix_mean, output_mean=args.output_tokens, range_ratio=0.66,
                           num_groups=args.groups, prefix_tokens=args.prefix_tokens, seed=round_index).build()
    prompts = PromptSynthesizer(seed=100 + round_index, token_id_low=10, token_id_high=8000)  # fresh prefixes per run
    warmup = [RequestSpec(0.0, 64, 4), RequestSpec(0.0, 64, 4)]  # unique prompts: warm the engines, no prefix
    asyncio.run(_run(cluster, warmup, PromptSynthesizer(seed=10_000 + round_index), RunConfig()))
    wait_for_quiet(0.25, 45.0)
    before = _computed(cluster)
    meter = OtherLoad.start()
    result = asyncio.run(_run(cluster, specs, prompts, RunConfig(request_timeout_s=120.0)))
    other_cores = meter.stop()
    return prefix_run(policy, round_index, result.records, result.duration_s, _computed(cluster) - before, slo,
                      other_cores)


async def _run(cluster: LocalCluster, specs, prompts, config: RunConfig):
    target = PdserveGrpcTarget(cluster.grpc_target)
    await target.open()
    try:
        return await run(target, specs, prompts, config)
    finally:
        await target.close()


def _report(runs: list[PrefixRun], args) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    medians = policy_medians(runs)
    lines = ["| policy | runs | prompt tokens computed (share of sent) | TTFT p50 ms | TTFT p90 ms | SLO attainment |",
             "|---|---|---|---|---|---|"]
    for policy, m in medians.items():
        lines.append(f"| {policy} | {m['runs']} | {m['computed_share']:.0%} | {m['ttft_p50_ms']:.0f} | "
                     f"{m['ttft_p90_ms']:.0f} | {m['attainment']:.0%} |")
    markdown = "\n".join(lines) + "\n"
    (out / "prefix_routing.md").write_text(markdown)
    (out / "prefix_routing.json").write_text(json.dumps(
        {"argv": sys.argv, "args": {k: str(v) for k, v in vars(args).items()}, "medians": medians,
         "runs": [asdict(r) | {"computed_share": r.computed_share} for r in runs]}, indent=2))
    _plot(medians, out / "prefix_routing.png")
    print(markdown)


def _plot(medians: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(medians)
    fig, (share, ttft) = plt.subplots(1, 2, figsize=(10, 4))
    share.bar(policies, [medians[p]["computed_share"] for p in policies], color=["tab:green", "tab:grey"])
    share.set_ylabel("prompt tokens computed / sent")
    share.set_ylim(0, 1.05)
    width = 0.35
    xs = range(len(policies))
    ttft.bar([x - width / 2 for x in xs], [medians[p]["ttft_p50_ms"] for p in policies], width, label="p50")
    ttft.bar([x + width / 2 for x in xs], [medians[p]["ttft_p90_ms"] for p in policies], width, label="p90")
    ttft.set_xticks(list(xs), policies)
    ttft.set_ylabel("TTFT (ms)")
    ttft.legend()
    fig.suptitle("Shared-prefix workload, 2 aggregated workers: prefix-aware vs least-loaded routing")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
