"""`pdserve up --ray ...`: the command-line options of the Ray launcher, and the spec they build.

Imports nothing heavy: `pdserve up --help` must stay fast whether or not Ray is installed.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

RAY_HELP = """\
Run the router and both pools as Ray actors on an existing Ray cluster instead of local processes.
Each actor runs the same `pdserve router|worker` process `pdserve up` runs here, on the node Ray
picks; a crashed member is restarted by Ray and re-registers in Redis. Needs `pip install
'pdserve[ray]'` and pdserve + the model directory on every node. See deploy/ray/README.md.
"""


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Ray (--ray)", RAY_HELP)
    group.add_argument("--ray", metavar="ADDRESS", default=None,
                       help="run on the Ray cluster at ADDRESS: 'auto' (started with `ray start` on this host), "
                            "HOST:PORT of the head node (its GCS: `ray start --head --port PORT`), or ray://HOST:10001")
    group.add_argument("--ray-auth-token-file", metavar="FILE", default="",
                       help="a file holding the Ray cluster's token (Ray's token authentication; `ray get-auth-token` "
                            "on the head prints it). Default: where Ray looks: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, "
                            "~/.ray/auth_token")
    group.add_argument("--cluster", default="default",
                       help="name of this pdserve cluster: its Ray namespace (pdserve-NAME) and Redis key prefix")
    group.add_argument("--redis-url", default="",
                       help="an existing Redis for the registry (default: redis-server in a Ray actor, with a "
                            "password pdserve generates)")
    group.add_argument("--redis-password-file", default="",
                       help="with --redis-url: a file holding that Redis's password (keep it out of the URL)")
    group.add_argument("--router-cpus", type=float, default=1.0, help="CPUs Ray reserves for the router")
    group.add_argument("--worker-cpus", type=float, default=1.0,
                       help="CPUs Ray reserves for each worker of both pools (default for the two below)")
    group.add_argument("--prefill-cpus", type=float, default=None, help="CPUs per prefill worker (default: --worker-cpus)")
    group.add_argument("--decode-cpus", type=float, default=None, help="CPUs per decode worker (default: --worker-cpus)")
    group.add_argument("--gpus-per-worker", type=int, default=0,
                       help="GPUs each worker of both pools asks for: 0 (CPU nodes) or 1; a worker never spans "
                            "several (the KV connector moves one tensor-parallel rank's cache)")
    group.add_argument("--prefill-gpus", type=int, default=None, help="GPUs per prefill worker (default: --gpus-per-worker)")
    group.add_argument("--decode-gpus", type=int, default=None, help="GPUs per decode worker (default: --gpus-per-worker)")
    group.add_argument("--max-restarts", type=int, default=-1,
                       help="times Ray restarts a crashed member (-1: always)")


def ray_cluster_spec(args: argparse.Namespace):
    """The RayClusterSpec of `pdserve up --ray ...`, checked before anything touches Ray (a worker
    asking for several GPUs is refused here, with the reason). CPU cores are pinned only when
    asked for (--prefill-cores/--decode-cores): the local default splits *this* host's cores."""
    from cli.commands.cluster_options import cluster_spec
    from launch.ray.spec import RayClusterSpec, RoleResources

    cores = {role: value for role, value in (("prefill", args.prefill_cores), ("decode", args.decode_cores))
             if value is not None}
    base = cluster_spec(args)
    # actors do not start in this directory: relative paths are made absolute here
    engine = replace(base.engine, model=_absolute(base.engine.model))
    from cli.commands.public_api_options import public_api_argv

    # the router's TLS and key files: paths the router's node sees (its actor adds --host NODE_IP)
    # the router's actor runs on whichever node Ray picks: bound to cores only when asked
    base = replace(base, engine=engine, cpu_cores=cores, cluster=args.cluster, router_cores=args.router_cores or "",
                   log_dir=os.path.abspath(base.log_dir) if base.log_dir else "",
                   router_flags=(*base.router_flags, *public_api_argv(args, with_host=False)))
    pools = {role: RoleResources(num_cpus=_or(getattr(args, f"{role}_cpus"), args.worker_cpus),
                                 num_gpus=_or(getattr(args, f"{role}_gpus"), args.gpus_per_worker))
             for role in ("prefill", "decode")}
    from pdserve.redis_auth import load_password

    password = load_password(args.redis_password_file) if args.redis_password_file else ""
    return RayClusterSpec(cluster=base, address=args.ray, auth_token_file=args.ray_auth_token_file,
                          redis_url=args.redis_url, redis_password=password, router=RoleResources(num_cpus=args.router_cpus),
                          prefill=pools["prefill"], decode=pools["decode"], max_restarts=args.max_restarts)


def _or(value, default):
    return default if value is None else value


def _absolute(path: str) -> str:
    """A path as every node sees it when the model is on shared storage at the same place; a
    Hugging Face model id (no such local path) is kept as given."""
    return os.path.abspath(path) if os.path.exists(path) or path.startswith(".") else path
