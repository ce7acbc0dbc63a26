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
                            "HOST:PORT of the head node, or ray://HOST:10001")
    group.add_argument("--cluster", default="default",
                       help="name of this pdserve cluster: its Ray namespace (pdserve-NAME) and Redis key prefix")
    group.add_argument("--redis-url", default="",
                       help="an existing Redis for the registry (default: redis-server in a Ray actor)")
    group.add_argument("--router-cpus", type=float, default=1.0, help="CPUs Ray reserves for the router")
    group.add_argument("--worker-cpus", type=float, default=1.0, help="CPUs Ray reserves for each worker")
    group.add_argument("--gpus-per-worker", type=int, default=0,
                       help="GPUs per worker; above 1, a placement group keeps them on one node")
    group.add_argument("--max-restarts", type=int, default=-1,
                       help="times Ray restarts a crashed member (-1: always)")


def ray_cluster_spec(args: argparse.Namespace):
    """The RayClusterSpec of `pdserve up --ray ...`. CPU cores are pinned only when asked for
    (--prefill-cores/--decode-cores): the local default splits *this* host's cores."""
    from pdserve.commands.up import cluster_spec
    from pdserve.ray.spec import RayClusterSpec, RoleResources

    cores = {role: value for role, value in (("prefill", args.prefill_cores), ("decode", args.decode_cores))
             if value is not None}
    base = cluster_spec(args)
    # actors do not start in this directory: relative paths are made absolute here
    engine = replace(base.engine, model=_absolute(base.engine.model))
    if args.gpus_per_worker > 1 and engine.tensor_parallel_size == 1:
        # a worker given several GPUs spans them all: the placement group reserves them on one node
        engine = replace(engine, tensor_parallel_size=int(args.gpus_per_worker))
    if engine.tensor_parallel_size > max(1, args.gpus_per_worker):
        raise ValueError(f"--tensor-parallel-size {engine.tensor_parallel_size} needs as many GPUs per worker "
                         f"(--gpus-per-worker is {args.gpus_per_worker:g})")
    base = replace(base, engine=engine, cpu_cores=cores, cluster=args.cluster,
                   log_dir=os.path.abspath(base.log_dir) if base.log_dir else "")
    return RayClusterSpec(cluster=base, address=args.ray, redis_url=args.redis_url,
                          router=RoleResources(num_cpus=args.router_cpus),
                          worker=RoleResources(num_cpus=args.worker_cpus, num_gpus=args.gpus_per_worker),
                          max_restarts=args.max_restarts)


def _absolute(path: str) -> str:
    """A path as every node sees it when the model is on shared storage at the same place; a
    Hugging Face model id (no such local path) is kept as given."""
    return os.path.abspath(path) if os.path.exists(path) or path.startswith(".") else path
