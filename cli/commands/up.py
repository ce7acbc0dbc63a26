"""`pdserve up`: the embedded default cluster on this host, until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from dataclasses import replace

from cli.commands.cluster_options import add_cluster_options, cluster_spec
from cli.commands.public_api_options import add_public_api_options, check_exposure, how_to_connect, public_api_argv
from cli.commands.ray_options import add_ray_options
from cli.commands.tracing_options import ENV as TRACES_ENV

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

The router listens on 127.0.0.1 unless --host says otherwise; beyond it, give TLS and API keys
(or --insecure), and `pdserve up` prints how clients connect:

  openssl rand -hex 32 > api-keys; chmod 600 api-keys
  pdserve up --model models/tiny --host 0.0.0.0 --api-key-file api-keys \\
       --tls-cert-file server.pem --tls-key-file server.key
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser("up", help="start a local cluster: redis, router, prefill and decode workers",
                                   description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_options(parser)
    add_ray_options(parser)
    add_public_api_options(parser, host_help="the router's listen address (local clusters; on Ray it listens on its "
                                             "node's address); beyond 127.0.0.1 it needs TLS and API keys, or --insecure")
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
        check_exposure(args, "up", args.host)   # first: nothing is probed or started for a refused setup
        spec = cluster_spec(args)
        spec = replace(spec, router_flags=(*spec.router_flags, *public_api_argv(args)))
    except (ValueError, OSError) as bad:
        console.print(f"[red]pdserve up:[/] {bad}", markup=True, highlight=False)
        return 2
    except SystemExit as bad:
        console.print(str(bad), markup=False, highlight=False, soft_wrap=True)
        return 2
    with console.status("starting redis, router and workers (vLLM engines take ~20 s)..."):
        cluster = LocalCluster(spec).start()
    try:
        console.print(f"[bold green]pdserve is up[/] ({spec.topology}: {spec.num_prefill} prefill, {spec.num_decode} decode, "
                      f"{spec.transport})")
        for line in how_to_connect(args, cluster.grpc_target, cluster.http_url):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        console.print(f"  metrics {cluster.http_url}/metrics   (router; Prometheus text format)")
        for worker_id, url in cluster.metrics_urls.items():
            console.print(f"          {url}   ({worker_id}: vllm:* and pdserve_worker_*)")
        if os.environ.get(TRACES_ENV):   # every process inherits it (cli.commands.tracing_options)
            console.print(f"  traces {os.environ[TRACES_ENV]}   (OpenTelemetry, OTLP/HTTP: router and workers)")
        console.print(f"  redis  {cluster.redis.url}   (password in {cluster.redis_password_file})")
        console.print(f"  secret {cluster.secret_file}   (the cluster secret: routers and workers you add need it)")
        console.print(f"  logs   {cluster.log_dir}")
        console.print("Ctrl-C to stop.")
        stop.wait()
    finally:
        with console.status("draining and stopping..."):
            cluster.stop()
    return 0
