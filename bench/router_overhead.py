"""What the router adds to time-to-first-token: TTFT through the router minus TTFT straight to the
prefill engine, same requests, interleaved. Run `--help`."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import grpc

from pdserve.engine import EngineSettings
from launch.local import ClusterSpec, LocalCluster
from pdserve.make_model import build_model
from pdserve.v1 import generation_pb2, generation_pb2_grpc, worker_pb2, worker_pb2_grpc

DESCRIPTION = """\
Starts a local cluster (router + 1 prefill + 1 decode worker, prefill on core 0, decode and the
router on core 1) and sends the same token-id prompts two ways, alternating, one at a time:

  via router   pdserve.v1.Generation/Generate to the router (validation, routing, Prefill RPC,
               first token streamed back): TTFT = send -> first streamed message
  direct       pdserve.v1.Worker/Prefill straight to the prefill worker's gRPC server around
               its vLLM engine: TTFT = send -> reply (the first token)

Both use max_tokens=1 and raw gRPC stubs on long-lived channels, and prefix caching is off, so both
run the same prefill; the difference is what the router adds. Reports p50 and p99 of each path
and of the per-pair difference, and writes a CDF plot.
"""


def measure(model: Path, num_pairs: int, prompt_tokens: int, warmup: int) -> dict[str, list[float]]:
    from rich.progress import Progress

    engine = EngineSettings(model=str(model), block_size=32, max_model_len=2048, kv_cache_bytes=128 << 20,
                            max_num_seqs=16, enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, cpu_cores={"prefill": "0", "decode": "1"},
                       log_dir=tempfile.mkdtemp(prefix="pdserve-router-overhead-"))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    rng = random.Random(7)
    sampling = generation_pb2.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    samples: dict[str, list[float]] = {"via router": [], "direct": []}
    with LocalCluster(spec) as cluster:  # up: its router routes to both workers
        prefill_id = cluster.worker_ids("prefill")[0]
        with grpc.insecure_channel(cluster.grpc_target) as router_channel, \
                cluster.worker_channel(prefill_id) as worker_channel:
            router = generation_pb2_grpc.GenerationStub(router_channel)
            worker = worker_pb2_grpc.WorkerStub(worker_channel)

            def via_router(ids: list[int]) -> float:
                request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=ids), sampling=sampling)
                started = time.perf_counter()
                next(iter(router.Generate(request, timeout=60)))
                return time.perf_counter() - started

            def direct(ids: list[int]) -> float:
                request = worker_pb2.PrefillRequest(request_id=uuid.uuid4().hex, prompt_token_ids=ids,
                                                    sampling=sampling, transfer_id=uuid.uuid4().hex)
                started = time.perf_counter()
                worker.Prefill(request, timeout=60)
                return time.perf_counter() - started

            ways = {"via router": via_router, "direct": direct}
            with Progress() as progress:
                task = progress.add_task("request pairs", total=num_pairs)
                for index in range(warmup + num_pairs):
                    ids = [rng.randrange(10, vocab) for _ in range(prompt_tokens)]
                    order = list(ways) if index % 2 == 0 else list(reversed(ways))  # ABBA: no order bias
                    for name in order:
                        seconds = ways[name](ids)
                        if index >= warmup:
                            samples[name].append(seconds)
                    if index >= warmup:
                        progress.advance(task)
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def report(samples: dict[str, list[float]], out: Path) -> str:
    paired = [r - d for r, d in zip(samples["via router"], samples["direct"])]
    rows = {**samples, "router - direct (per pair)": paired}
    lines = ["| | p50 ms | p90 ms | p99 ms | mean ms |", "|---|---:|---:|---:|---:|"]
    for name, values in rows.items():
        lines.append(f"| {name} | {percentile(values, 50) * 1e3:.2f} | {percentile(values, 90) * 1e3:.2f} | "
                     f"{percentile(values, 99) * 1e3:.2f} | {statistics.mean(values) * 1e3:.2f} |")
    overhead_p50 = (percentile(samples["via router"], 50) - percentile(samples["direct"], 50)) * 1e3
    overhead_p99 = (percentile(samples["via router"], 99) - percentile(samples["direct"], 99)) * 1e3
    lines.append("")
    lines.append(f"router overhead: p50 {overhead_p50:.2f} ms, p99 {overhead_p99:.2f} ms "
                 f"(difference of the paths' percentiles; n = {len(paired)} pairs)")
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "router_overhead.json").write_text(json.dumps(samples))
    (out / "router_overhead.md").write_text(text + "\n")
    _plot(samples, out / "router_overhead.png")
    return text


def _plot(samples: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, values in samples.items():
        ordered = sorted(v * 1e3 for v in values)
        axes.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    axes.set_xlabel("TTFT (ms)")
    axes.set_ylabel("share of requests")
    axes.set_title("TTFT through the router vs straight to the prefill engine")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO / "models" / "tiny",
                        help="checkpoint to serve (default: models/tiny, built if missing)")
    parser.add_argument("--pairs", type=int, default=300, help="timed request pairs")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens")
    parser.add_argument("--warmup", type=int, default=20, help="uncounted pairs first")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results",
                        help="folder for router_overhead.{json,md,png}")
    args = parser.parse_args(argv)
    model = args.model if (args.model / "config.json").exists() else build_model("tiny", args.model)
    print(report(measure(model, args.pairs, args.prompt_tokens, args.warmup), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
