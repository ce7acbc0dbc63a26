"""`pdserve worker`: one prefill or decode worker process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from cli.commands.credential_options import add_cluster_secret_option, add_redis_password_option, redis_connection_url
from cli.commands.engine_options import add_engine_options, engine_settings
from cli.commands.tracing_options import add_tracing_option, start_tracing

HELP = """\
Runs one vLLM engine as a pdserve worker: serves the Worker gRPC API (and grpc.health.v1),
registers itself in Redis under a TTL lease it renews every heartbeat, and drains on SIGTERM: it
leaves the registry, finishes the requests in flight and (prefill) waits for decode workers to pull
the KV it holds, up to --drain-timeout-s. `pdserve up` starts these for you; run one by hand to add
capacity.
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser("worker", help="run one prefill or decode worker", description=HELP,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=["prefill", "decode"], required=True)
    parser.add_argument("--redis-url", required=True, help="the cluster's registry, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--cluster", default="default", help="cluster name: the registry key prefix")
    parser.add_argument("--worker-id", default=None, help="unique id in the registry (default: random)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)")
    parser.add_argument("--advertise-host", default=os.environ.get("PDSERVE_ADVERTISE_HOST"),
                        help="address others reach this worker at (default: --host; env PDSERVE_ADVERTISE_HOST)")
    parser.add_argument("--grpc-port", type=int, default=0, help="Worker gRPC port (0: any free port)")
    parser.add_argument("--kv-port", type=int, default=0, help="prefill: KV transfer port (0: any free port)")
    parser.add_argument("--transport", choices=["tcp", "torch", "shm", "auto"], default="auto",
                        help="KV transport: tcp sockets; torch.distributed p2p (gloo on CPU, nccl on GPU); shm, "
                             "one-sided reads of the prefill worker's cache in shared memory (same host); auto, "
                             "shm where the peers share a host, else tcp (default: %(default)s)")
    parser.add_argument("--cpu-cores", default="",
                        help="CPU hosts: cores this worker runs on, e.g. 0 or 0-1: its processes and the engine's "
                             "compute threads are bound there (default: no binding)")
    parser.add_argument("--lease-s", type=float, default=30.0, help="prefill: how long KV waits for its consumer")
    parser.add_argument("--kv-pull-timeout-s", type=float, default=30.0,
                        help="every wait inside a KV pull (decode) or serving one (prefill); a pull that times out "
                             "costs a recompute of the prompt (default: %(default)s)")
    parser.add_argument("--kv-encryption", choices=["off", "auto", "on"], default="auto",
                        help="encrypt KV bytes between workers (AES-256-GCM, keys from the cluster secret): auto, on links between hosts; on, always (a worker set to off is refused); off, never (default: %(default)s)")
    parser.add_argument("--ttl-s", type=float, default=3.0, help="registry lease; a dead worker vanishes after it")
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="registry refresh interval")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0,
                        help="on SIGTERM, how long to wait for in-flight requests and (prefill) KV pulls "
                             "before stopping the engine; keep it below the supervisor's kill timeout")
    add_cluster_secret_option(parser, "routers must prove to call this worker and which authenticates KV transfers "
                                      "between workers")
    add_redis_password_option(parser)
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics here (0: off)")
    parser.add_argument("--ready-file", default=None, help="write the gRPC address here once serving")
    add_tracing_option(parser)
    add_engine_options(parser)
    parser.set_defaults(func=run, skips_teardown=True)


def run(args: argparse.Namespace) -> int:
    _reexec_for_a_forked_engine(args)
    from pdserve.worker.config import WorkerConfig

    if args.role == "prefill":
        from prefill_worker.main import serve
    else:
        from decode_worker.main import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    extra = {"worker_id": args.worker_id} if args.worker_id else {}
    config = WorkerConfig(
        role=args.role, engine=engine_settings(args, args.cpu_cores), redis_url=redis_connection_url(args, "worker"),
        cluster=args.cluster, bind_host=args.host, advertise_host=args.advertise_host or args.host,
        grpc_port=args.grpc_port, kv_port=args.kv_port, transport=args.transport, lease_s=args.lease_s,
        kv_pull_timeout_s=args.kv_pull_timeout_s, heartbeat_s=args.heartbeat_s, ttl_s=args.ttl_s, drain_timeout_s=args.drain_timeout_s,
        cluster_secret_file=args.cluster_secret_file, kv_encryption=args.kv_encryption, **extra,
    )
    start_tracing(args, "worker", f"pdserve-{config.role}", config.worker_id)
    code = asyncio.run(serve(config, ready_file=args.ready_file, metrics_port=args.metrics_port))
    return code


def _reexec_for_a_forked_engine(args: argparse.Namespace) -> None:
    """Re-executes this process, once and before anything imports torch, under the environment its
    engine's processes need (thread binding, preloaded allocator, pdserve's vLLM plugin settings),
    so that the engine core can be forked from it instead of spawned: no second import of vLLM
    (`pdserve.engine_process`). Returns where there is nothing to do, or where this process is not
    the command itself (`cli.main.main` called with its arguments by another program)."""
    if not getattr(args, "from_command_line", False):
        return
    from pdserve.engine import engine_start_env, on_gpu, resolved_executor
    from pdserve.engine_process import initial_environ, reexec, reexec_env

    settings = engine_settings(args, args.cpu_cores, measure_dtype=False)
    gpu = on_gpu()
    needed = engine_start_env(settings, os.environ, gpu)
    env = reexec_env(settings.engine_start, gpu=gpu, executor=resolved_executor(settings, gpu), needed=needed,
                     initial=initial_environ())
    if env is not None:
        reexec(env)
