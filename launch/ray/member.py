"""The Ray actor behind every cluster member: it owns one process (see `launch.supervisor`).

`MemberActor(launch)` starts, on the node Ray placed it, the same process the local launcher
starts: `python -m cli.main worker|router ... --host NODE_IP --ready-file F`, or redis-server, where
NODE_IP is the address Ray knows the node by (a worker also advertises it to the registry).
A worker registers itself in Redis and heartbeats, as everywhere else; the actor adds nothing to
that path. What the actor adds is its life cycle:

- the process exits on its own after it was ready (a crash, an OOM kill): the actor exits too
  (`os._exit`), so Ray restarts it (`max_restarts`) and the new actor starts a new process with
  the same member id. Meanwhile the dead worker's Redis lease lapses and routers stop using it;
- the process exits before it was ever ready (a bad model path, a port in use): the actor stays
  up and reports `failed` with the log, rather than restart-looping on a configuration error;
- the actor dies (its node, a SIGKILL): the process receives SIGTERM (PR_SET_PDEATHSIG), so a
  worker deregisters and drains, and Ray restarts the actor as above;
- `stop()`: SIGTERM, the worker drains, the process exits; the actor is then killed by its owner.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import ray

from launch.commands import redis_argv
from launch.credentials import write_member_files, write_redis_config
from launch.supervisor import ChildExited, ChildProcess, pdserve_child, tcp_probe
from launch.ray.spec import Launch, MemberState
from pdserve.roles import ROLES
from pdserve.worker.config import free_port

logger = logging.getLogger("launch.ray.member")


class _MemberActor:
    def __init__(self, launch: Launch):
        self.launch = launch
        self.node_ip = ray.util.get_node_ip_address()
        self.metrics_url = ""
        folder = Path(launch.log_dir) if launch.log_dir else Path(tempfile.mkdtemp(prefix="pdserve-ray-"))
        folder.mkdir(parents=True, exist_ok=True)
        self.child = self._child(folder).start()

    def _child(self, folder: Path) -> ChildProcess:
        if self.launch.kind == "redis":
            return self._redis_child(folder)
        # bound to and advertised at the address Ray knows this node by (`ray start --node-ip-address`)
        advertise = ["--advertise-host", self.node_ip] if self.launch.kind in ROLES else []
        credentials = (write_member_files(self.launch.credentials, folder, self.launch.member_id)
                       if self.launch.credentials else [])
        metrics = []
        if self.launch.kind in ROLES:   # every worker serves vllm:* and pdserve_worker_* (as under `pdserve up`)
            port = free_port(self.node_ip)
            metrics, self.metrics_url = ["--metrics-port", str(port)], f"http://{self.node_ip}:{port}/metrics"
        return pdserve_child([*self.launch.pdserve_args, "--host", self.node_ip, *advertise, *credentials, *metrics],
                             folder, self.launch.member_id, on_exit=self._on_child_exit)

    def _redis_child(self, folder: Path) -> ChildProcess:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(f"redis-server is not installed on Ray node {self.node_ip}: install it there "
                               "(apt-get install redis-server) or pass --redis-url of a Redis you run")
        port = free_port(self.node_ip)
        workdir = folder / "redis-data"
        workdir.mkdir(exist_ok=True)
        url = f"redis://{self.node_ip}:{port}/0"
        password = self.launch.credentials.redis_password if self.launch.credentials else ""
        config = write_redis_config(folder, password, f".{self.launch.member_id}.redis.conf") if password else ""
        # other nodes must reach it: with a password protected mode is moot, without one it would refuse them
        return ChildProcess(redis_argv(binary, self.node_ip, port, str(workdir), protected=bool(password),
                                       config_file=config),
                            folder / f"{self.launch.member_id}.log", tcp_probe(self.node_ip, port, url),
                            on_exit=self._on_child_exit)

    def _on_child_exit(self, returncode: int, was_ready: bool) -> None:
        if was_ready:
            logger.error("%s exited with %s after serving: exiting so Ray restarts this actor",
                         self.launch.member_id, returncode)
            os._exit(1)

    # ---- remote methods --------------------------------------------------------------------------
    def ready(self, timeout_s: float) -> str:
        """The member's address once it serves; raises ChildExited (with its log) or TimeoutError."""
        return self.child.wait_ready(timeout_s)

    def state(self) -> MemberState:
        if self.child.is_ready():
            status, detail = "ready", ""
        elif self.child.alive():
            status, detail = "starting", ""
        else:
            status, detail = "failed", f"exited with {self.child.returncode}:\n{self.child.log_tail(10)}"
        return MemberState(member_id=self.launch.member_id, kind=self.launch.kind, status=status,
                           address=self.child.address or "", node_ip=self.node_ip, actor_pid=os.getpid(),
                           child_pid=self.child.pid, log_path=str(self.child.log_path), detail=detail,
                           metrics_url=self._metrics_url())

    def _metrics_url(self) -> str:
        if self.launch.kind == "router" and self.child.address:   # "GRPC_TARGET HTTP_URL"
            return f"{self.child.address.split()[-1]}/metrics"
        return self.metrics_url

    def stop(self, timeout_s: float) -> int:
        """Graceful: SIGTERM (a worker deregisters and drains), SIGKILL after `timeout_s`."""
        return self.child.stop(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        return self.child.log_tail(lines)


MemberActor = ray.remote(_MemberActor)

__all__ = ["MemberActor", "ChildExited"]
