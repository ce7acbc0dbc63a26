"""The Ray actor behind every cluster member: it owns one process (see `launch.supervisor`).

`MemberActor(launch)` starts, on the node Ray placed it, the same process the local launcher
starts: `python -m cli.main worker|router ... --host NODE_IP --ready-file F`, or redis-server.
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
import socket
import sys
import tempfile
from pathlib import Path

import ray

from launch.supervisor import ChildExited, ChildProcess, Probe, ready_file_probe
from launch.commands import pdserve_argv, redis_argv
from launch.ray.spec import Launch, MemberState
from pdserve.worker.config import free_port

logger = logging.getLogger("launch.ray.member")


class _MemberActor:
    def __init__(self, launch: Launch):
        self.launch = launch
        self.node_ip = ray.util.get_node_ip_address()
        folder = Path(launch.log_dir) if launch.log_dir else Path(tempfile.mkdtemp(prefix="pdserve-ray-"))
        folder.mkdir(parents=True, exist_ok=True)
        argv, probe = self._command(folder)
        env = os.environ | {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                            "PYTHONUNBUFFERED": "1"}
        self.child = ChildProcess(argv, folder / f"{launch.member_id}.log", probe, env=env,
                                  on_exit=self._on_child_exit).start()

    def _command(self, folder: Path) -> tuple[list[str], Probe]:
        if self.launch.kind == "redis":
            return self._redis_command(folder)
        ready = folder / f"{self.launch.member_id}.ready"
        ready.unlink(missing_ok=True)
        argv = pdserve_argv([*self.launch.pdserve_args, "--host", self.node_ip, "--ready-file", str(ready)])
        return argv, ready_file_probe(ready)

    def _redis_command(self, folder: Path) -> tuple[list[str], Probe]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(f"redis-server is not installed on Ray node {self.node_ip}: install it there "
                               "(apt-get install redis-server) or pass --redis-url of a Redis you run")
        port = free_port(self.node_ip)
        workdir = folder / "redis-data"
        workdir.mkdir(exist_ok=True)
        url = f"redis://{self.node_ip}:{port}/0"

        def probe() -> str | None:
            try:
                with socket.create_connection((self.node_ip, port), timeout=0.2):
                    return url
            except OSError:
                return None

        return redis_argv(binary, self.node_ip, port, str(workdir), protected=False), probe

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
                           child_pid=self.child.pid, log_path=str(self.child.log_path), detail=detail)

    def stop(self, timeout_s: float) -> int:
        """Graceful: SIGTERM (a worker deregisters and drains), SIGKILL after `timeout_s`."""
        return self.child.stop(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        return self.child.log_tail(lines)


MemberActor = ray.remote(_MemberActor)

__all__ = ["MemberActor", "ChildExited"]
