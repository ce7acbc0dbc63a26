"""`pdserve demo`: a handful of prompts through a cluster, with each phase's timings."""

from __future__ import annotations

import argparse
import statistics

from cli.commands.cluster_options import add_cluster_options, cluster_spec

HELP = """\
Starts the embedded cluster (as `pdserve up` would, on free ports), sends a few prompts through the
client SDK, prints each answer with its per-phase timings (queued, prefill, KV transfer bytes and
seconds, decode) and a summary, then shuts everything down. With --target, uses a running cluster.
"""

PROMPTS = [
    "The history of the printing press begins",
    "def fibonacci(n):",
    "A disaggregated serving system splits prefill and decode because",
    "Once upon a time, in a village by the sea, there lived an old fisherman who",
    "Q: What is the capital of France?\nA:",
    "Summarise the following: the key-value cache stores the attention keys and values of every "
    "token seen so far, so that each new token attends to them without recomputing the prompt.",
]


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="send a few prompts through a cluster and print timings",
                                   description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="a running router's gRPC address (default: start one)")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens to generate per prompt")
    add_cluster_options(parser)
    parser.set_defaults(func=run, grpc_port=0, http_port=0)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from launch.local import LocalCluster

    console = Console()
    if args.target:
        return _send_prompts(console, args.target, args.max_tokens)
    with console.status("starting a local cluster: redis, router, 1 prefill + 1 decode worker..."):
        cluster = LocalCluster(cluster_spec(args)).start()
    try:
        console.print(f"cluster up: router at {cluster.grpc_target}, logs in {cluster.log_dir}")
        return _send_prompts(console, cluster.grpc_target, args.max_tokens)
    finally:
        with console.status("shutting down..."):
            cluster.stop()
        console.print("cluster stopped cleanly")


def _send_prompts(console, target: str, max_tokens: int) -> int:
    from rich.table import Table

    from pdserve.client import Client

    table = Table(title="per-phase timings (ms)")
    for column in ("#", "queued", "prefill", "KV bytes", "KV transfer", "decode", "TTFT", "E2E", "tokens"):
        table.add_column(column, justify="right")
    all_timings = []
    with Client(target) as client:
        for index, prompt in enumerate(PROMPTS, 1):
            chunks = list(client.generate(prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True))
            timings = chunks[-1].timings
            all_timings.append(timings)
            console.print(f"[bold]{index}. {prompt!r}[/]\n   -> {''.join(c.text for c in chunks)!r}")
            ms = lambda s: f"{s * 1000:.1f}"  # noqa: E731
            table.add_row(str(index), ms(timings.queued_s), ms(timings.prefill_s), f"{timings.kv_transfer_bytes:,}",
                          ms(timings.kv_transfer_s), ms(timings.decode_s), ms(timings.ttft_s), ms(timings.e2e_s),
                          str(timings.output_tokens))
    console.print(table)
    ttft = [t.ttft_s for t in all_timings]
    tpot = [(t.e2e_s - t.ttft_s) / max(t.output_tokens - 1, 1) for t in all_timings]
    moved = sum(t.kv_transfer_bytes for t in all_timings)
    console.print(f"summary: {len(all_timings)} requests, all disaggregated: {all(t.disaggregated for t in all_timings)}; "
                  f"median TTFT {statistics.median(ttft) * 1000:.1f} ms, median TPOT {statistics.median(tpot) * 1000:.1f} ms, "
                  f"KV moved {moved:,} bytes")
    return 0
