"""`pdserve up --ray ADDRESS`: the cluster as Ray actors, until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading

from launch.supervisor import ChildExited
from cli.commands.ray_options import ray_cluster_spec


def run_on_ray(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        from launch.ray.cluster import RayCluster, RayClusterError
    except ModuleNotFoundError as missing:
        if not (missing.name or "").startswith("ray"):
            raise
        console.print(f"[red]--ray needs Ray ({missing}): pip install 'pdserve[ray]'[/]")
        return 2
    try:
        spec = ray_cluster_spec(args)
        with console.status(f"starting pdserve on Ray at {spec.address}: redis, router and workers "
                            "(vLLM engines take ~20 s)..."):
            cluster = RayCluster(spec).start()
    except (ValueError, RayClusterError, ChildExited, TimeoutError) as error:
        console.print("[red]pdserve did not start on Ray:[/]")
        console.print(str(_root_cause(error)), soft_wrap=True, markup=False, highlight=False)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        console.print(f"[bold green]pdserve is up on Ray[/] ({spec.cluster.topology}: {spec.cluster.num_prefill} prefill, "
                      f"{spec.cluster.num_decode} decode, {args.transport}; Ray namespace {spec.namespace})")
        console.print(f"  gRPC   {cluster.grpc_target}   (pdserve.client.Client)")
        console.print(f"  HTTP   {cluster.http_url}/v1/completions   (OpenAI-compatible)")
        console.print(f"  redis  {cluster.redis_url}")
        console.print("  members (actor: status, address; log file on its node):")
        for member in cluster.members():
            console.print(f"    {member.member_id:<10} {member.status:<8} {member.address}", soft_wrap=True)
            console.print(f"    {'':<10} {member.node_ip}:{member.log_path}", soft_wrap=True, style="dim")
        console.print("Resize: planner.actuators.ray.RayActuator, or from Python "
                      f"RayCluster.attach({spec.address!r}, {spec.cluster.cluster!r}).scale('decode', 2).", soft_wrap=True)
        console.print("Ctrl-C to stop.")
        stop.wait()
    finally:
        with console.status("draining and stopping the Ray actors..."):
            cluster.stop()
    return 0


def _root_cause(error: BaseException) -> BaseException:
    """The exception a member raised, without the actor-call tracebacks Ray wraps around it."""
    while getattr(error, "cause", None) is not None and error.cause is not error:
        error = error.cause
    return error
