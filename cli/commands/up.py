"""`pdserve up`: the embedded default cluster on this host, until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading

from cli.commands.cluster_options import add_cluster_options, cluster_spec
from cli.commands.ray_options import add_ray_options

HELP = """\
Starts a whole pdserve cluster on this machine: a private redis-server on a free port, the router,
and the prefill and decode workers as processes. Prints the endpoints, serves until Ctrl-C, then
drains and stops everything. Logs go to --log-dir, with the cluster's credentials, fresh for each
start (mode 0600): cluster-secret (workers serve only a router proving it; KV transfers between
workers are authenticated with it) and redis-password (the Redis requires it). A process you add
by hand gets them as --cluster-secret-file and --redis-password-file (SECURITY.md).

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
    try:
        spec = cluster_spec(args)
    except (ValueError, OSError) as bad:
        console.print(f"[red]pdserve up:[/] {bad}", markup=True, highlight=False)
        return 2
    with console.status("starting redis, router and workers (vLLM engines take ~20 s)..."):
        cluster = LocalCluster(spec).start()
    try:
        console.print(f"[bold green]pdserve is up[/] ({spec.topology}: {spec.num_prefill} prefill, {spec.num_decode} decode, "
                      f"{spec.transport})")
        console.print(f"  gRPC   {cluster.grpc_target}   (pdserve.client.Client)")
        console.print(f"  HTTP   {cluster.http_url}/v1/completions   (OpenAI-compatible)")
        console.print(f"  metrics {cluster.http_url}/metrics   (router; Prometheus text format)")
        for worker_id, url in cluster.metrics_urls.items():
            console.print(f"          {url}   ({worker_id}: vllm:* and pdserve_worker_*)")
        console.print(f"  redis  {cluster.redis.url}   (password in {cluster.redis_password_file})")
        console.print(f"  secret {cluster.secret_file}   (the cluster secret: routers and workers you add need it)")
        console.print(f"  logs   {cluster.log_dir}")
        console.print("Ctrl-C to stop.")
        stop.wait()
    finally:
        with console.status("draining and stopping..."):
            cluster.stop()
    return 0
