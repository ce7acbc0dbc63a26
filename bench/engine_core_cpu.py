"""What a prompt costs vLLM's engine-core process in a cluster's prefill worker against the same
engine alone, side by side in one run. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.vllm_plugin import HOLD_WAIT_ENV

REPO = Path(__file__).resolve().parents[1]

DESCRIPTION = """\
The profile's engine tables are timed on vLLM's engine alone, and its serving pass counts the CPU of
the workers' API processes, the router and the client, but not the engine-core process inside a
worker (its work is "in the tables already", planner.profiler.serving_probe). In a cluster that
process does more than the engine alone: pdserve's KV connector (its scheduler side, the lease and
its checksums, the pull server's threads) runs in it. This measures the difference.

Starts, on this host, a 1P+1D cluster (prefill on core 0 with the router, decode on core 1, the
profile's layout) and beside it the same engine alone on core 0 (`start_engine(..., "colocated")`,
as the profiler's engine pass runs it). Then, in rounds, for each prompt length, sends --requests
lone requests (one at a time, 0.2 s apart, fresh random token ids, no prefix cache) to each: the
engine alone with max_tokens=1 (its prefill), the cluster with max_tokens=2 (its prefill, the KV
pull and one decode step elsewhere). The order alternates by round (ABBA). For every group it reads
/proc's CPU of each process (10 ms ticks), net of what the process takes idle (measured first), and
reports per request, in ms:

  alone engine core    the engine-core process of the engine alone
  prefill engine core  the prefill worker's engine-core process (the model, the connector's sides)
  prefill API          the prefill worker's own process (gRPC, vLLM's front end)
  decode engine core, decode API, router

and the median TTFT of each way. The extra per request, prefill engine core minus alone engine
core, is CPU on the prefill core that neither the engine tables nor the serving pass count.
--hold-wait-ms 0 20 starts one cluster per value (all idle but the one measured) and takes them in
turn with the engine alone: vLLM's own loop while the prefill engine holds blocks for a pull
(0) against pdserve's wait (pdserve.vllm_plugin, "Holding"). Writes summary.json and a PNG bar
chart to --out.
"""



@dataclass(frozen=True)
class Group:
    """One group of lone requests: which way ("alone", or a cluster's label), prompt length, count,
    wall seconds, CPU seconds of each of that way's processes (net of nothing yet), each TTFT."""
    way: str
    prompt_tokens: int
    requests: int
    wall_s: float
    cpu_s: dict[str, float]
    ttft_s: list[float]


def per_request_ms(groups: list[Group], idle_cores: dict[str, dict[str, float]]) -> dict[tuple[str, int], dict[str, float]]:
    """(way, prompt tokens) -> role -> CPU ms per request over every group of that way and length,
    net of each role's idle CPU (`idle_cores[way][role]`, cores) over the groups' wall time; pure."""
    pooled: dict[tuple[str, int], dict[str, float]] = {}
    for key in {(g.way, g.prompt_tokens) for g in groups}:
        chosen = [g for g in groups if (g.way, g.prompt_tokens) == key]
        requests, wall_s = sum(g.requests for g in chosen), sum(g.wall_s for g in chosen)
        idle = idle_cores.get(key[0], {})
        roles = sorted({role for g in chosen for role in g.cpu_s})
        pooled[key] = {role: 1e3 * (sum(g.cpu_s.get(role, 0.0) for g in chosen) - idle.get(role, 0.0) * wall_s)
                       / requests for role in roles}
    return pooled


def extra_ms(pooled: dict[tuple[str, int], dict[str, float]], prompt_tokens: int, cluster: str) -> float:
    """A cluster's prefill engine core per request minus the engine core alone's, at one length."""
    return (pooled[(cluster, prompt_tokens)]["prefill engine core"]
            - pooled[("alone", prompt_tokens)]["engine core"])


def cluster_label(hold_wait_ms: float | None) -> str:
    return "cluster" if hold_wait_ms is None else f"cluster, hold wait {hold_wait_ms:g} ms"


def _descendants(pid: int) -> list[int]:
    from loadgen.proc_cpu import process_tree

    return process_tree(pid)[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "models" / "bench"), help="model folder (pdserve make-model)")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[32, 512, 1024], help="prompt lengths")
    parser.add_argument("--requests", type=int, default=10, help="lone requests per group (default 10)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each a group of each way and length (4)")
    parser.add_argument("--transport", default="shm", help="the cluster's KV transport (default shm)")
    parser.add_argument("--vllm-spin-ms", type=float, default=None,
                        help="vLLM's busy-poll cap in both engines (default: pdserve's)")
    parser.add_argument("--hold-wait-ms", type=float, nargs="+", default=None,
                        help="one cluster per value, measured side by side: how long its prefill engine core waits "
                             "for a request between empty steps while it only holds blocks for a pull "
                             "(PDSERVE_VLLM_HOLD_WAIT_S; 0: vLLM's own 1 ms loop; default: one cluster, pdserve's)")
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--out", required=True, help="folder for summary.json and the plot")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    groups, idle, ways_info = asyncio.run(measure(args))
    pooled = per_request_ms(groups, idle)
    clusters = [cluster_label(v) for v in (args.hold_wait_ms or [None])]
    report = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "host_cpu": _cpu_model(), "idle_cores": idle, "info": ways_info,
              "per_request_ms": {f"{way} {n}": roles for (way, n), roles in sorted(pooled.items())},
              "extra_engine_core_ms": {f"{c} {n}": extra_ms(pooled, n, c) for c in clusters for n in args.prompt_tokens},
              "ttft_ms_median": {f"{way} {n}": 1e3 * statistics.median([t for g in groups if (g.way, g.prompt_tokens)
                                                                        == (way, n) for t in g.ttft_s])
                                 for way, n in sorted(pooled)},
              "groups": [asdict(g) for g in groups]}
    (out / "summary.json").write_text(json.dumps(report, indent=1))
    _print(report)
    _plot(pooled, args.prompt_tokens, clusters, out / "engine_core_cpu.png")
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


async def measure(args) -> tuple[list[Group], dict[str, dict[str, float]], dict]:
    import contextlib

    import numpy as np
    from rich.progress import Progress

    from launch.local import ClusterSpec, LocalCluster
    from loadgen.proc_cpu import cpu_seconds
    from pdserve.client import AsyncClient
    from pdserve.engine import EngineSettings, start_engine, tokens_prompt

    extra = {} if args.vllm_spin_ms is None else {"vllm_spin_ms": args.vllm_spin_ms}
    common = dict(model=args.model, block_size=32, max_model_len=args.max_model_len,
                  kv_cache_bytes=args.kv_cache_mb << 20, enable_prefix_caching=False, **extra)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(7)
    groups: list[Group] = []
    with contextlib.ExitStack() as stack:
        clusters = {}
        for hold_wait_ms in args.hold_wait_ms or [None]:   # first: the engine alone's thread variables must not reach them
            os.environ.pop(HOLD_WAIT_ENV, None)
            if hold_wait_ms is not None:   # its workers inherit it (pdserve.engine keeps a value set)
                os.environ[HOLD_WAIT_ENV] = f"{hold_wait_ms / 1000:g}"
            spec = ClusterSpec(engine=EngineSettings(**common), transport=args.transport,
                               cpu_cores={"prefill": "0", "decode": "1"},
                               log_dir=tempfile.mkdtemp(prefix="pdserve-engine-core-cpu-"))
            clusters[cluster_label(hold_wait_ms)] = stack.enter_context(LocalCluster(spec))
        os.environ.pop(HOLD_WAIT_ENV, None)
        before = set(_descendants(os.getpid()))
        engine = start_engine(EngineSettings(**common, cpu_cores="0"), "colocated")
        alone_core = [p for p in _descendants(os.getpid()) if p not in before]
        readers = {"alone": {"engine core": lambda: cpu_seconds(alone_core)}}
        pids = {}
        for label, cluster in clusters.items():
            pid = pids[label] = {role: cluster.workers[cluster.worker_ids(role)[0]].pid for role in ("prefill", "decode")}
            readers[label] = {
                "prefill engine core": lambda pid=pid: cpu_seconds(_descendants(pid["prefill"])),
                "prefill API": lambda pid=pid: cpu_seconds([pid["prefill"]]),
                "decode engine core": lambda pid=pid: cpu_seconds(_descendants(pid["decode"])),
                "decode API": lambda pid=pid: cpu_seconds([pid["decode"]]),
                "router": lambda cluster=cluster: cpu_seconds([cluster.router.pid]),
            }
        try:
            async with contextlib.AsyncExitStack() as clients:
                async def alone(ids: list[int]) -> float:
                    from vllm import SamplingParams

                    started = time.perf_counter()
                    async for _ in engine.generate(tokens_prompt(ids), SamplingParams(max_tokens=1, temperature=0.0,
                                                                                      ignore_eos=True),
                                                   f"alone-{time.monotonic_ns()}"):
                        pass
                    return time.perf_counter() - started

                def through(client):
                    async def send(ids: list[int]) -> float:
                        started, first = time.perf_counter(), None
                        async for _ in client.generate(token_ids=ids, max_tokens=2, ignore_eos=True, temperature=0.0):
                            first = first or time.perf_counter() - started
                        return first
                    return send

                ways = {"alone": alone}
                for label, cluster in clusters.items():
                    ways[label] = through(await clients.enter_async_context(AsyncClient(cluster.grpc_target)))
                for way in ways:  # warm every way: first requests pay one-off costs
                    for _ in range(3):
                        await ways[way]([int(i) for i in rng.integers(10, vocab, size=64)])
                await asyncio.sleep(1.0)
                idle = {way: await _idle_cores(readers[way], 3.0) for way in ways}
                with Progress() as progress:
                    task = progress.add_task("groups", total=args.rounds * len(ways) * len(args.prompt_tokens))
                    for index in range(args.rounds):
                        order = list(ways) if index % 2 == 0 else list(reversed(ways))   # ABBA
                        for n in args.prompt_tokens:
                            for way in order:
                                groups.append(await _group(way, ways[way], n, args.requests, vocab, rng, readers[way]))
                                progress.advance(task)
        finally:
            engine.shutdown()
            engine = None
            gc.collect()  # AsyncLLM.__del__ shuts down again: let it run now, not at interpreter exit
    model = Path(args.model).resolve()
    info = {"alone_engine_core_pids": alone_core, "cluster_pids": pids, "transport": args.transport,
            "engine": dict(common, model=str(model.relative_to(REPO)) if model.is_relative_to(REPO) else args.model)}
    return groups, idle, info


async def _idle_cores(readers, seconds: float) -> dict[str, float]:
    before, started = {role: read() for role, read in readers.items()}, time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - started
    return {role: max(0.0, read() - before[role]) / wall for role, read in readers.items()}


async def _group(way: str, send, prompt_tokens: int, requests: int, vocab: int, rng, readers) -> Group:
    await asyncio.sleep(0.2)
    before, started, ttft = {role: read() for role, read in readers.items()}, time.perf_counter(), []
    for _ in range(requests):
        await asyncio.sleep(0.2)
        ttft.append(await send([int(i) for i in rng.integers(10, vocab, size=prompt_tokens)]))
    await asyncio.sleep(0.2)  # the last request's handoff and vLLM's polling end inside the window
    wall = time.perf_counter() - started
    return Group(way, prompt_tokens, requests, wall, {role: read() - before[role] for role, read in readers.items()},
                 ttft)


def _print(report: dict) -> None:
    print(f"\nCPU ms per request, net of idle ({report['host_cpu']}):")
    for key, roles in report["per_request_ms"].items():
        shown = ", ".join(f"{role} {ms:.1f}" for role, ms in roles.items())
        print(f"  {key}: {shown}; TTFT p50 {report['ttft_ms_median'][key]:.1f} ms")
    for key, ms in report["extra_engine_core_ms"].items():
        print(f"{key}-token prompts: the prefill engine core takes {ms:+.1f} ms a request more than the engine alone")


def _plot(pooled, lengths: list[int], clusters: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    bars = [("alone", "engine core", "engine alone")] + [(c, "prefill engine core", f"prefill worker ({c})")
                                                         for c in clusters]
    width = 0.8 / len(bars)
    for index, (way, role, label) in enumerate(bars):
        ax.bar([i + (index - (len(bars) - 1) / 2) * width for i in range(len(lengths))],
               [pooled[(way, n)][role] for n in lengths], width, label=label)
    ax.set_xticks(range(len(lengths)), [f"{n} tokens" for n in lengths])
    ax.set_ylabel("engine-core CPU ms per lone request")
    ax.set_title("vLLM's engine-core process: the 1P+1D prefill worker's against the engine alone")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
