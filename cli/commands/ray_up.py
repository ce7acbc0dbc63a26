"""`pdserve up --ray ADDRESS`: the cluster as Ray actors, until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading

from launch.supervisor import ChildExited
from cli.commands.public_api_options import check_ray_exposure, how_to_connect
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
        check_ray_exposure(args)
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
        for line in how_to_connect(args, cluster.grpc_target, cluster.http_url):
            console.print(line, soft_wrap=True, markup=False, highlight=False)
        for line in _credential_lines(cluster, spec.cluster.log_dir):
            console.print(line, soft_wrap=True, markup=False, highlight=False)
        console.print("  members (actor: status, address; log file on its node):")
        for member in cluster.members():
            console.print(f"    {member.member_id:<10} {member.status:<8} {member.address}", soft_wrap=True)
            console.print(f"    {'':<10} {member.node_ip}:{member.log_path}", soft_wrap=True, style="dim")
            if member.metrics_url:
                console.print(f"    {'':<10} metrics {member.metrics_url}", soft_wrap=True, markup=False)
        console.print("Resize: planner.actuators.ray.RayActuator, or from Python "
                      f"RayCluster.attach({spec.address!r}, {spec.cluster.cluster!r}).scale('decode', 2).", soft_wrap=True)
        console.print("Ctrl-C to stop.")
        stop.wait()
    finally:
        with console.status("draining and stopping the Ray actors..."):
            cluster.stop()
    return 0


def _credential_lines(cluster, log_dir: str) -> list[str]:
    """Writes the cluster's credentials to 0600 files on this host (for processes started by hand and
    `pdserve planner`) and says where they are and where Redis is."""
    import tempfile
    from pathlib import Path

    from launch.credentials import write_private_file

    credentials = cluster.credentials
    if credentials is None:
        return [f"  redis  {cluster.redis_url}"]
    folder = Path(log_dir or tempfile.mkdtemp(prefix="pdserve-ray-credentials-"))
    folder.mkdir(parents=True, exist_ok=True)
    secret = write_private_file(folder / "cluster-secret", credentials.cluster_secret + "\n")
    lines = [f"  secret {secret}   (the cluster secret: --cluster-secret-file of anything you add)"]
    if credentials.redis_password:
        password = write_private_file(folder / "redis-password", credentials.redis_password + "\n")
        return [f"  redis  {cluster.redis_url}   (password in {password})", *lines]
    return [f"  redis  {cluster.redis_url}", *lines]


def _root_cause(error: BaseException) -> BaseException:
    """The exception a member raised, without the actor-call tracebacks Ray wraps around it."""
    while getattr(error, "cause", None) is not None and error.cause is not error:
        error = error.cause
    return error
