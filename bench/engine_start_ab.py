"""A worker's vLLM engine core forked from it against spawned, side by side in one run. Run `--help`."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("fork", "spawn")
LAYOUTS = {   # ClusterSpec fields of each layout
    "1P+1D": {"cpu_cores": {"prefill": "0", "decode": "1"}},
    "1Cx2": {"topology": "aggregated", "num_prefill": 0, "num_decode": 1, "cpu_cores": {"decode": "0-1"}},
}

DESCRIPTION = """\
On CPU vLLM spawns its engine-core process, which imports vLLM a second time in every worker;
`--vllm-engine-start auto` forks it from the worker instead (pdserve.engine_process). This measures
what that changes, on this host, one cluster at a time, the methods in ABBA order over --rounds:

  start      wall seconds from launching a cluster (--layout: 1P+1D, prefill on core 0 and decode on
             core 1; or 1Cx2, one aggregated worker over both cores) to
             every process ready and routed, and the CPU seconds each worker's process tree used
             by then (the worker, its engine core)
  serving    --requests lone requests of --prompt-tokens random token ids (the same ones for both
             methods), --max-tokens each, greedy: TTFT and time per output token medians; their
             tokens must be identical across methods (the run fails otherwise)
  threads    the cores each engine-core thread may run on (/proc: Cpus_allowed_list), and how
             its engine core started (the worker's log line)

Writes summary.json and a PNG (start seconds and CPU, TTFT and TPOT, per method) to --out.
"""


@dataclass(frozen=True)
class Round:
    """One cluster's life under one start method."""
    method: str
    start_s: float                       # launch -> ready and routed
    start_cpu_s: dict[str, float]        # worker role -> CPU s of its process tree at ready
    ttft_s: list[float]
    tpot_s: list[float]
    tokens: list[list[int]]
    thread_cores: dict[str, list[str]]   # worker role -> the distinct Cpus_allowed_list of its engine core's threads
    started_by: dict[str, str]           # worker role -> the start method its log names


def abba(methods: tuple[str, ...], rounds: int) -> list[str]:
    """The methods in ABBA order over `rounds` rounds: drift in the host's speed falls on both."""
    return [method for index in range(rounds) for method in (methods if index % 2 == 0 else methods[::-1])]


def summarize(rounds: list[Round]) -> dict:
    """Per method, medians over its rounds (start wall and CPU, TTFT, TPOT over every request), and
    fork's over spawn's of each; whether every method's tokens were the same."""
    per_method: dict[str, dict[str, float]] = {}
    for method in dict.fromkeys(r.method for r in rounds):
        mine = [r for r in rounds if r.method == method]
        per_method[method] = {
            "rounds": len(mine),
            "start_s": statistics.median(r.start_s for r in mine),
            "start_cpu_s_per_worker": statistics.median(cpu for r in mine for cpu in r.start_cpu_s.values()),
            "ttft_ms": 1000 * statistics.median(t for r in mine for t in r.ttft_s),
            "tpot_ms": 1000 * statistics.median(t for r in mine for t in r.tpot_s),
        }
    ratios = {}
    if {"fork", "spawn"} <= per_method.keys():
        ratios = {key: per_method["fork"][key] / per_method["spawn"][key]
                  for key in ("start_s", "start_cpu_s_per_worker", "ttft_ms", "tpot_ms") if per_method["spawn"][key]}
    return {"per_method": per_method, "fork_over_spawn": ratios,
            "same_tokens": all(r.tokens == rounds[0].tokens for r in rounds)}


def thread_cores(pid: int) -> list[str]:
    """The distinct Cpus_allowed_list of process `pid`'s threads."""
    cores = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                cores.add(line.split(":", 1)[1].strip())
    return sorted(cores)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "models" / "tiny"), help="model directory (default: models/tiny)")
    parser.add_argument("--dtype", default="float32", help="engine dtype (explicit, so no dtype probe runs at start)")
    parser.add_argument("--rounds", type=int, default=4, help="clusters per method, in ABBA order (default: 4)")
    parser.add_argument("--requests", type=int, default=8, help="lone requests per cluster (default: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prompt length in tokens (default: 512)")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (default: 32)")
    parser.add_argument("--kv-cache-mb", type=int, default=256, help="KV cache per engine, MiB (default: 256)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/engine_start"), help="output directory")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="1P+1D",
                        help="1P+1D: prefill on core 0, decode on core 1; 1Cx2: one aggregated worker over both "
                             "cores (two OpenMP threads) (default: 1P+1D)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from --out's summary.json")
    args = parser.parse_args(argv)
    if args.plot_only:
        rounds = [Round(**r) for r in json.loads((args.out / "summary.json").read_text())["rounds"]]
        _plot(rounds, args.out / "engine_start.png")
        return 0
    rounds = asyncio.run(measure(args))
    report = {"summary": summarize(rounds), "rounds": [asdict(r) for r in rounds],
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "command": " ".join(["python", "bench/engine_start_ab.py", *(argv if argv is not None else sys.argv[1:])])}
    model = Path(args.model).resolve()
    report["args"]["model"] = str(model.relative_to(REPO)) if model.is_relative_to(REPO) else args.model
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(report, indent=1))
    _print(report["summary"], rounds)
    _plot(rounds, args.out / "engine_start.png")
    return 0 if report["summary"]["same_tokens"] else 1


async def measure(args) -> list[Round]:
    import numpy as np

    from launch.local import ClusterSpec, LocalCluster
    from loadgen.proc_cpu import cpu_seconds, process_tree
    from pdserve.client import AsyncClient
    from pdserve.engine import EngineSettings

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(7)
    prompts = [[int(i) for i in rng.integers(10, vocab, size=args.prompt_tokens)] for _ in range(args.requests)]
    rounds = []
    order = abba(METHODS, args.rounds)
    for index, method in enumerate(order):
        engine = EngineSettings(model=args.model, dtype=args.dtype, max_model_len=args.prompt_tokens + args.max_tokens + 64,
                                kv_cache_bytes=args.kv_cache_mb << 20, enable_prefix_caching=False, engine_start=method)
        spec = ClusterSpec(engine=engine, **LAYOUTS[args.layout],
                           log_dir=tempfile.mkdtemp(prefix=f"pdserve-engine-start-{method}-"))
        print(f"[{index + 1}/{len(order)}] {method}: starting a {args.layout} cluster", file=sys.stderr, flush=True)
        started = time.perf_counter()
        with LocalCluster(spec) as cluster:
            start_s = time.perf_counter() - started
            pids = {role: cluster.workers[cluster.worker_ids(role)[0]].pid for role in ("prefill", "decode")
                    if cluster.worker_ids(role)}
            start_cpu = {role: cpu_seconds(process_tree(pid)) for role, pid in pids.items()}
            cores = {role: sorted({c for child in process_tree(pid)[1:] for c in thread_cores(child)})
                     for role, pid in pids.items()}
            ttft, tpot, tokens = [], [], []
            async with AsyncClient(cluster.grpc_target) as client:
                for prompt in prompts:
                    await asyncio.sleep(0.2)
                    sent, times, ids = time.perf_counter(), [], []
                    async for chunk in client.generate(token_ids=prompt, max_tokens=args.max_tokens, temperature=0.0,
                                                       ignore_eos=True):
                        times += [time.perf_counter()] * len(chunk.token_ids)
                        ids += chunk.token_ids
                    ttft.append(times[0] - sent)
                    tpot.append((times[-1] - times[0]) / max(1, len(times) - 1))
                    tokens.append(ids)
            logs = {role: _start_line(cluster.log_dir, cluster.worker_ids(role)[0]) for role in pids}
        rounds.append(Round(method, start_s, start_cpu, ttft, tpot, tokens, cores, logs))
        print(f"  up in {start_s:.1f} s, worker CPU {start_cpu}, TTFT p50 {1000 * statistics.median(ttft):.0f} ms, "
              f"TPOT p50 {1000 * statistics.median(tpot):.1f} ms, {logs}", file=sys.stderr, flush=True)
    return rounds


def _start_line(log_dir: Path, worker_id: str) -> str:
    """The start method a worker's log names ("" where it says none)."""
    for path in Path(log_dir).glob(f"*{worker_id}*"):
        for line in path.read_text(errors="replace").splitlines():
            if "engine core starts by" in line:
                return line.rsplit("starts by", 1)[1].strip()
    return ""


def _print(summary: dict, rounds: list[Round]) -> None:
    print(f"{'method':8} {'rounds':>6} {'start s':>8} {'start CPU s/worker':>19} {'TTFT ms':>8} {'TPOT ms':>8}")
    for method, row in summary["per_method"].items():
        print(f"{method:8} {row['rounds']:>6} {row['start_s']:>8.1f} {row['start_cpu_s_per_worker']:>19.1f} "
              f"{row['ttft_ms']:>8.1f} {row['tpot_ms']:>8.2f}")
    print("fork / spawn: " + ", ".join(f"{key} {value:.2f}x" for key, value in summary["fork_over_spawn"].items()))
    print(f"same tokens every round: {summary['same_tokens']}; engine-core thread cores: "
          + "; ".join(f"{r.method} {r.thread_cores}" for r in rounds[:2]))


def _plot(rounds: list[Round], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("cluster up (s)", lambda r: [r.start_s]),
              ("CPU per worker at start (s)", lambda r: list(r.start_cpu_s.values())),
              ("TTFT (ms)", lambda r: [1000 * t for t in r.ttft_s]),
              ("time per output token (ms)", lambda r: [1000 * t for t in r.tpot_s])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (title, values) in zip(axes, panels):
        data = [[v for r in rounds if r.method == method for v in values(r)] for method in METHODS]
        ax.boxplot(data, tick_labels=[f"{m} ({len([r for r in rounds if r.method == m])})" for m in METHODS])
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
    fig.suptitle("vLLM's engine core forked from the worker vs spawned (one cluster at a time, ABBA)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
