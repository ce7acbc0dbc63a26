"""What streams decoding cost the prefill core, where the router is bound, while nothing is prefilled:

    python bench/stream_cpu.py --out bench/results/stream_cpu --profile planner/profiles/<profile>.json

A 1P+1D cluster (`launch.local`, the `pdserve up` defaults: shm, the prefill worker on core 0 with
the router bound there, the decode worker on core 1) first sits idle, then for each batch size B
keeps B requests streaming (16-token prompts, outputs longer than the run) and, once they all
stream, reads over `--seconds`: tokens per second the client received, the router's CPU (its
process tree) and this process's (the client), and how busy each core was (/proc/stat), each net of
its idle load. A prompt computed on core 0 meanwhile shares that core with what is busy there. With
`--profile` (repeatable), what each profile's serving costs charge the router and the client at the
same token rate and batch (`host_cpu_s_per_step`, `_per_token` and the router's part: what the
simulator's host model spreads over its window), and the decode step as served (the batch over the
tokens per second) beside what each profile charges for it: its engine step at that batch and
context, plus its served terms (the line, `decode_step_s` + `decode_cpu_s_per_token` x batch), stretched by
the host's load as the profile's own fit stretches it (`stream_fit.fit_served_steps`).
Writes stream_cpu.json, .md and .png. About 3 minutes on the bench model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BATCHES = (1, 2, 4, 8, 16, 32, 64)
PROMPT_TOKENS = 16


def busy_cores(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, float]:
    """Per CPU of /proc/stat, the share of its time not idle (idle and iowait) between two readings."""
    out = {}
    for cpu, values in after.items():
        delta = [b - a for a, b in zip(before[cpu], values)]
        total = sum(delta)
        out[cpu] = 1.0 - (delta[3] + delta[4]) / total if total > 0 else 0.0
    return out


def charged_cores(costs, tokens_per_s: float, batch: int) -> dict[str, float]:
    """What a profile's `ServingCosts` charge the router and the client (cores) while `batch`
    streams get `tokens_per_s` in all: per token, and per step (one token a stream), as the
    serving probe's fit reads them (`stream_fit.StreamCpu.host_load_cores`)."""
    from planner.profiler.stream_fit import StreamCpu

    client, router = StreamCpu.of(costs).host_load_cores(tokens_per_s, batch)
    return {"router": router, "client": client}


def charged_step(costs, engine, batch: int, context_tokens: float, tokens_per_s: float) -> dict[str, float]:
    """What a profile charges for one served decode step of `batch` streams holding `context_tokens`
    in all while they get `tokens_per_s`: `engine` (its fitted `PerfModel`) step, and that plus the
    served terms of `costs` (its `ServingCosts`), stretched as the probe's fit stretches them
    (`stream_fit.StreamCpu.decode_stretch`) (seconds)."""
    from planner.profiler.stream_fit import StreamCpu

    engine_s = engine.decode_step_s(batch, round(context_tokens))
    stretch = StreamCpu.of(costs).decode_stretch(tokens_per_s, batch, costs.host_cores)
    served_s = (engine_s + costs.decode_serving_s(batch, by_batch=False)) * stretch
    return {"engine_s": engine_s, "served_s": served_s, "stretch": stretch}


def _cpu_stat() -> dict[str, list[int]]:
    rows = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *values = line.split()
            rows[name] = [int(v) for v in values[:8]]
    return rows


def _reading(router_pid: int) -> tuple[float, float, float, dict]:
    from loadgen.proc_cpu import cpu_seconds, process_tree

    return time.perf_counter(), cpu_seconds(process_tree(router_pid)), time.process_time(), _cpu_stat()


def _window(before, after, tokens: int) -> dict:
    seconds = after[0] - before[0]
    return {"seconds": seconds, "tokens_per_s": tokens / seconds, "router_cores": (after[1] - before[1]) / seconds,
            "client_cores": (after[2] - before[2]) / seconds, "busy": busy_cores(before[3], after[3])}


async def measure(target: str, router_pid: int, batches: tuple[int, ...], seconds: float, vocab_size: int,
                  max_model_len: int, start_timeout_s: float = 300.0) -> dict:
    import numpy as np

    from pdserve.client import AsyncClient

    rng = np.random.default_rng(9)
    before = _reading(router_pid)
    await asyncio.sleep(seconds / 2)
    idle = _window(before, _reading(router_pid), 0)
    print(f"idle: router {idle['router_cores']:.3f}, client {idle['client_cores']:.3f}, busy "
          + ", ".join(f"{cpu} {share:.3f}" for cpu, share in idle["busy"].items()), flush=True)
    rows = []
    for batch in batches:
        stop, counted, streaming = asyncio.Event(), [0], [0]

        async def stream(client) -> None:
            ids = [int(i) for i in rng.integers(10, vocab_size, size=PROMPT_TOKENS)]
            seen = 0
            async for chunk in client.generate(token_ids=ids, max_tokens=max_model_len - PROMPT_TOKENS,
                                               ignore_eos=True, temperature=0.0):
                had, seen = seen, seen + len(chunk.token_ids)
                counted[0] += len(chunk.token_ids)
                if had < 2 <= seen:
                    streaming[0] += 1
                if stop.is_set():
                    break

        async with AsyncClient(target) as client:
            tasks = [asyncio.create_task(stream(client)) for _ in range(batch)]
            deadline = time.monotonic() + start_timeout_s
            while streaming[0] < batch:
                if failed := [task for task in tasks if task.done() and task.exception()]:
                    raise RuntimeError(f"batch {batch}: a stream failed before all streamed") from failed[0].exception()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"batch {batch}: {streaming[0]} of {batch} streams after {start_timeout_s:g} s")
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # past the last handoff
            start, tokens_at_start = _reading(router_pid), counted[0]
            await asyncio.sleep(seconds)
            window = _window(start, _reading(router_pid), counted[0] - tokens_at_start)
            # the batch's context at the window's middle: each stream's prompt and what it had by then
            window["context_tokens"] = batch * PROMPT_TOKENS + tokens_at_start + (counted[0] - tokens_at_start) / 2
            window["served_step_s"] = batch / window["tokens_per_s"]
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        row = {"batch": batch, **window,
               "router_net_cores": max(0.0, window["router_cores"] - idle["router_cores"]),
               "client_net_cores": max(0.0, window["client_cores"] - idle["client_cores"]),
               "prefill_core_net_busy": max(0.0, window["busy"]["cpu0"] - idle["busy"].get("cpu0", 0.0))}
        rows.append(row)
        print(f"batch {batch:3d}: {row['tokens_per_s']:6.0f} tokens/s, a step {row['served_step_s'] * 1e3:.2f} ms; "
              f"router {row['router_net_cores']:.3f} cores, "
              f"client {row['client_net_cores']:.3f}; core 0 busy {row['prefill_core_net_busy']:.3f} beyond idle",
              flush=True)
        await asyncio.sleep(1.0)
    return {"idle": idle, "rows": rows}


def _markdown(rows: list[dict], profiles: list[tuple[str, object, object]]) -> str:
    """Two tables: the CPU streaming takes beside what each profile charges for it, then the served
    decode step beside each profile's engine step and its served charge."""
    head = ["batch", "tokens/s", "router (cores)", "client (cores)", "core 0 busy beyond idle"]
    head += [f"charged by {name}: router / client" for name, _, _ in profiles]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["batch"]), f"{row['tokens_per_s']:.0f}", f"{row['router_net_cores']:.3f}",
                 f"{row['client_net_cores']:.3f}", f"{row['prefill_core_net_busy']:.3f}"]
        for _, costs, _ in profiles:
            charged = charged_cores(costs, row["tokens_per_s"], row["batch"])
            cells.append(f"{charged['router']:.3f} / {charged['client']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    head = ["batch", "context (tokens)", "served step (ms)"]
    head += [f"{name}: engine / charged (ms, err)" for name, _, _ in profiles]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["batch"]), f"{row['context_tokens']:.0f}", f"{row['served_step_s'] * 1e3:.2f}"]
        for _, costs, engine in profiles:
            step = charged_step(costs, engine, row["batch"], row["context_tokens"], row["tokens_per_s"])
            error = step["served_s"] / row["served_step_s"] - 1
            cells.append(f"{step['engine_s'] * 1e3:.2f} / {step['served_s'] * 1e3:.2f} ({error:+.0%})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict], profiles: list[tuple[str, object, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    batches = [row["batch"] for row in rows]
    ax.plot(batches, [row["router_net_cores"] for row in rows], "o-", label="router, measured")
    ax.plot(batches, [row["client_net_cores"] for row in rows], "s-", label="client, measured")
    ax.plot(batches, [row["prefill_core_net_busy"] for row in rows], "^-", label="core 0 busy beyond idle")
    for name, costs, _ in profiles:
        charged = [charged_cores(costs, row["tokens_per_s"], row["batch"]) for row in rows]
        ax.plot(batches, [c["router"] for c in charged], "o--", label=f"router, charged by {name}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="requests streaming (batch)", ylabel="cores", title="what streaming takes beside the decode core")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "models" / "bench"), help="model folder (default models/bench)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes, comma-separated")
    parser.add_argument("--seconds", type=float, default=12.0, help="each batch's measured window (default 12)")
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--profile", type=Path, action="append", default=[],
                        help="a profile whose serving costs are set beside the measurement (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        parser.error("needs two cores: the prefill worker's (0) and the decode worker's (1)")
    from launch.commands import ClusterSpec
    from launch.local import LocalCluster
    from pdserve.client import Client
    from pdserve.engine import EngineSettings
    from planner.perf_model import fit_perf_model
    from planner.profile import load_profile

    # (name, serving costs, fitted engine model), each profile fitted once
    profiles = [(path.stem, profile.serving, fit_perf_model(profile).model)
                for path, profile in ((path, load_profile(path)) for path in args.profile)]
    engine = EngineSettings(model=args.model, max_model_len=args.max_model_len, kv_cache_bytes=args.kv_cache_mb << 20,
                            enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, transport="shm", cpu_cores={"prefill": "0", "decode": "1"})
    with LocalCluster(spec) as cluster:
        with Client(cluster.grpc_target) as client:
            vocab_size = client.model_info().vocab_size
        result = asyncio.run(measure(cluster.grpc_target, cluster.router.pid,
                                     tuple(int(b) for b in args.batches.split(",")), args.seconds, vocab_size,
                                     args.max_model_len))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stream_cpu.json").write_text(json.dumps(
        {"command": " ".join(sys.argv), "router_cores": spec.router_cpu_cores, **result,
         "charged": {name: [charged_cores(costs, row["tokens_per_s"], row["batch"])
                            | charged_step(costs, engine, row["batch"], row["context_tokens"], row["tokens_per_s"])
                            for row in result["rows"]]
                     for name, costs, engine in profiles}}, indent=1))
    (args.out / "stream_cpu.md").write_text(_markdown(result["rows"], profiles))
    _plot(result["rows"], profiles, args.out / "stream_cpu.png")
    print(_markdown(result["rows"], profiles))
    print(f"wrote {args.out}/stream_cpu.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
