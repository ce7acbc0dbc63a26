"""`pdserve up`: the embedded default cluster on this host, until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from cli.commands.engine_options import add_engine_options, engine_settings
from cli.commands.ray_options import add_ray_options

HELP = """\
Starts a whole pdserve cluster on this machine: a private redis-server on a free port, the router,
and the prefill and decode workers as processes. Prints the endpoints, serves until Ctrl-C, then
drains and stops everything. Logs go to --log-dir.

  pdserve up --model models/tiny
  curl http://127.0.0.1:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 16}' \\
       -H 'content-type: application/json'
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser("up", help="start a local cluster: redis, router, prefill and decode workers",
                                   description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_options(parser)
    add_ray_options(parser)
    parser.set_defaults(func=run)


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", type=int, default=1, help="prefill workers (default: %(default)s)")
    parser.add_argument("--decode", type=int, default=1, help="decode workers (default: %(default)s)")
    parser.add_argument("--transport", choices=["tcp", "torch"], default="tcp", help="KV transport")
    parser.add_argument("--grpc-port", type=int, default=50051, help="router gRPC port (0: any free port)")
    parser.add_argument("--http-port", type=int, default=8000, help="router HTTP port (0: any free port)")
    parser.add_argument("--prefill-cores", default=None, help="CPU cores for prefill engines (default: first half)")
    parser.add_argument("--decode-cores", default=None, help="CPU cores for decode engines (default: second half)")
    parser.add_argument("--local-prefill-max-tokens", type=int, default=0,
                        help="prompts this short run on a decode worker alone (0: always disaggregate)")
    parser.add_argument("--log-dir", default="", help="where process logs go (default: a temporary folder)")
    add_engine_options(parser)


def split_cores(num_cores: int) -> dict[str, str]:
    """Prefill gets the first half of the cores, decode the rest; one core: no binding."""
    if num_cores < 2:
        return {}
    half = num_cores // 2
    as_range = lambda lo, hi: str(lo) if lo == hi else f"{lo}-{hi}"  # noqa: E731
    return {"prefill": as_range(0, half - 1), "decode": as_range(half, num_cores - 1)}


def cluster_spec(args: argparse.Namespace):
    from launch.local import ClusterSpec

    cores = split_cores(os.cpu_count() or 1)
    if args.prefill_cores is not None:
        cores["prefill"] = args.prefill_cores
    if args.decode_cores is not None:
        cores["decode"] = args.decode_cores
    return ClusterSpec(engine=engine_settings(args), num_prefill=args.prefill, num_decode=args.decode,
                       transport=args.transport, grpc_port=args.grpc_port, http_port=args.http_port,
                       cpu_cores=cores, local_prefill_max_tokens=args.local_prefill_max_tokens, log_dir=args.log_dir)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "ray", None):
        from cli.commands.ray_up import run_on_ray

        return run_on_ray(args)
    from rich.console import Console

    from launch.local import LocalCluster

    console = Console()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with console.status("starting redis, router and workers (vLLM engines take ~20 s)..."):
        cluster = LocalCluster(cluster_spec(args)).start()
    try:
        console.print(f"[bold green]pdserve is up[/] ({args.prefill} prefill, {args.decode} decode, {args.transport})")
        console.print(f"  gRPC   {cluster.grpc_target}   (pdserve.client.Client)")
        console.print(f"  HTTP   {cluster.http_url}/v1/completions   (OpenAI-compatible)")
        console.print(f"  redis  {cluster.redis.url}")
        console.print(f"  logs   {cluster.log_dir}")
        console.print("Ctrl-C to stop.")
        stop.wait()
    finally:
        with console.status("draining and stopping..."):
            cluster.stop()
    return 0
