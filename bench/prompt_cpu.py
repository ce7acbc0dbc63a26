"""What a long prompt costs each process and thread of a 1P+1D cluster under steady load. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kv_transfer.threads import KV_THREAD_PREFIX  # noqa: E402  (the repository on the path first)

DESCRIPTION = """\
The profile's serving pass charges each worker's core the CPU of its API process and, since they
are counted, its KV connector's threads (planner.profiler.serving_probe), per request and per
prompt token; the engine tables hold the engine's own steps. This reads, under the same steady
load with short and with long prompts, the CPU of every process of a cluster by thread, to see
what a long prompt costs where, and what neither the tables nor the serving pass hold.

Starts a 1P+1D cluster on this host (prefill on core 0 with the router, decode on core 1, as
`pdserve up` places them; --transport, default shm), then in --rounds rounds sends a group of
--requests Poisson requests at --rate req/s with --short-prompt tokens and one with --long-prompt
tokens (ABBA: the order flips every round), each with --output tokens. For each group it reads
/proc's CPU of every thread of the router, each worker's API process and its engine's process
(10 ms ticks) and reports per request, in ms, pooled over rounds:

  router                the router's process tree
  prefill API           the prefill worker's own process (gRPC, vLLM's front end)
  prefill engine        its engine process's main thread (the steps, vLLM's scheduler)
  prefill KV            its KV connector's threads (pdserve-kv-*: the pull server)
  prefill other         its engine process's other threads (gloo, ZMQ)
  decode API, decode engine, decode KV (the pulls), decode other

and each one's difference long - short per prompt token (us). A thread that ends within a group
is not counted (the workers' threads live as long as they do). Writes summary.json and a PNG.
About 2 minutes a round on the tiny model.
"""

COLUMNS = ("router", "prefill API", "prefill engine", "prefill KV", "prefill other",
           "decode API", "decode engine", "decode KV", "decode other")


def column_of(role: str, is_worker_process: bool, is_main_thread: bool, thread_name: str) -> str:
    """The report's column for a thread: `role` "router" or a worker's ("prefill", "decode");
    `is_worker_process`: in the worker's own process (its API), else in a descendant (its engine);
    `is_main_thread`: the engine process's main thread."""
    if role == "router":
        return "router"
    if is_worker_process:
        return f"{role} API"
    if thread_name.startswith(KV_THREAD_PREFIX):
        return f"{role} KV"
    return f"{role} engine" if is_main_thread else f"{role} other"


def per_request_ms(groups: list[dict], prompt: int) -> dict[str, float]:
    """Each column's CPU per request (ms) over the groups of `prompt` tokens, pooled."""
    chosen = [g for g in groups if g["prompt_tokens"] == prompt]
    requests = sum(g["requests"] for g in chosen)
    return {c: 1e3 * sum(g["cpu_s"].get(c, 0.0) for g in chosen) / requests for c in COLUMNS} if requests else {}


def per_prompt_token_us(short_ms: dict[str, float], long_ms: dict[str, float], short: int, long: int) -> dict[str, float]:
    """(long - short) per request over the prompts' difference, us a prompt token, per column."""
    return {c: 1e3 * (long_ms[c] - short_ms[c]) / (long - short) for c in COLUMNS}


def order(rounds: int, short: int, long: int) -> list[int]:
    """The groups' prompt lengths in turn: short, long, then long, short, ... (ABBA)."""
    return [n for r in range(rounds) for n in ((short, long) if r % 2 == 0 else (long, short))]


def thread_cpu_s(pid: int, role: str) -> Counter:
    """CPU seconds so far of every live thread under `pid` (a worker's process or the router), by column."""
    from loadgen.proc_cpu import threads_cpu_s

    totals: Counter = Counter()
    for proc, task, name, cpu_s in threads_cpu_s(pid):
        main = task == proc and name.startswith("VLLM")   # the engine process's own thread
        totals[column_of(role, proc == pid, main, name)] += cpu_s
    return totals


async def steady_group(target: str, rate: float, requests: int, prompt: int, output: int, seed: int) -> int:
    from loadgen.harness import WorkloadConfig, make_target, run_all_ok
    from loadgen.prompts import PromptSynthesizer

    specs = WorkloadConfig(kind="random", arrival="poisson", rate_rps=rate, num_requests=requests,
                           prompt_mean=prompt, output_mean=output, range_ratio=0.0, seed=seed).build()
    result = await run_all_ok(make_target("pdserve", target), specs, PromptSynthesizer(seed=seed))
    return len(result.records)


def measure(args) -> list[dict]:
    from launch.local import ClusterSpec, LocalCluster
    from pdserve.engine import EngineSettings

    engine = EngineSettings(model=args.model, block_size=32, max_model_len=args.max_model_len,
                            kv_cache_bytes=args.kv_cache_mb << 20, enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, transport=args.transport, cpu_cores={"prefill": "0", "decode": "1"},
                       log_dir=tempfile.mkdtemp(prefix="pdserve-prompt-cpu-"))
    groups = []
    with LocalCluster(spec) as cluster:
        pids = {"router": cluster.router.pid,
                **{role: cluster.workers[cluster.worker_ids(role)[0]].pid for role in ("prefill", "decode")}}

        def read() -> Counter:
            total: Counter = Counter()
            for role, pid in pids.items():
                total.update(thread_cpu_s(pid, role))
            return total

        asyncio.run(steady_group(cluster.grpc_target, args.rate, 8, args.short_prompt, args.output, seed=99))  # warm
        for i, prompt in enumerate(order(args.rounds, args.short_prompt, args.long_prompt)):
            before, started = read(), time.perf_counter()
            requests = asyncio.run(steady_group(cluster.grpc_target, args.rate, args.requests, prompt, args.output,
                                                seed=100 + i))
            after, wall_s = read(), time.perf_counter() - started
            groups.append({"prompt_tokens": prompt, "requests": requests, "wall_s": wall_s,
                           "cpu_s": {c: max(0.0, after[c] - before[c]) for c in COLUMNS}})
            print(f"group {i + 1}: {prompt}-token prompts, {requests} requests in {wall_s:.0f} s: "
                  + ", ".join(f"{c} {1e3 * groups[-1]['cpu_s'][c] / requests:.1f}" for c in COLUMNS) + " ms a request",
                  flush=True)
    return groups


def table(short_ms: dict, long_ms: dict, per_token: dict, short: int, long: int) -> str:
    lines = [f"| column | {short}-token prompt ms/request | {long}-token prompt ms/request | us a prompt token |",
             "|---|---:|---:|---:|"]
    lines += [f"| {c} | {short_ms[c]:.2f} | {long_ms[c]:.2f} | {per_token[c]:+.2f} |" for c in COLUMNS]
    return "\n".join(lines)


def plot(short_ms: dict, long_ms: dict, short: int, long: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(COLUMNS))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.bar(x - 0.2, [short_ms[c] for c in COLUMNS], 0.4, label=f"{short}-token prompts")
    ax.bar(x + 0.2, [long_ms[c] for c in COLUMNS], 0.4, label=f"{long}-token prompts")
    ax.set_xticks(x, COLUMNS, rotation=25, ha="right")
    ax.set_ylabel("CPU ms per request")
    ax.set_title("CPU per request by process and thread, 1P+1D under steady load")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "models" / "tiny"), help="model folder (pdserve make-model)")
    parser.add_argument("--short-prompt", type=int, default=128, help="short prompts' tokens (128)")
    parser.add_argument("--long-prompt", type=int, default=1433, help="long prompts' tokens (1433, long-short's mean)")
    parser.add_argument("--output", type=int, default=24, help="output tokens of every request (24)")
    parser.add_argument("--rate", type=float, default=3.0, help="requests a second in every group (3)")
    parser.add_argument("--requests", type=int, default=90, help="requests a group (90)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each a group of each prompt length (2)")
    parser.add_argument("--transport", default="shm", help="the cluster's KV transport (shm)")
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--out", required=True, help="folder for summary.json and prompt_cpu.png")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    groups = measure(args)
    short_ms, long_ms = per_request_ms(groups, args.short_prompt), per_request_ms(groups, args.long_prompt)
    per_token = per_prompt_token_us(short_ms, long_ms, args.short_prompt, args.long_prompt)
    report = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "per_request_ms": {str(args.short_prompt): short_ms, str(args.long_prompt): long_ms},
              "per_prompt_token_us": per_token, "groups": groups}
    (out / "summary.json").write_text(json.dumps(report, indent=1))
    print(table(short_ms, long_ms, per_token, args.short_prompt, args.long_prompt))
    plot(short_ms, long_ms, args.short_prompt, args.long_prompt, out / "prompt_cpu.png")
    print(f"wrote {out / 'summary.json'} and {out / 'prompt_cpu.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
