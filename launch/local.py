"""A local cluster of processes: a private Redis, a router, prefill and decode workers.

Used by `pdserve up`, the demo, the tests, the benchmarks and the planner's local actuator.
Each process is `pdserve <command>` in its own process group; `add_worker`/`remove_worker`
change the pools while the cluster runs (removal is SIGTERM to the worker process alone, as a
container runtime sends it: the worker drains with its engine intact, then stops it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launch.commands import ClusterSpec, pdserve_argv
from launch.orphans import die_with_parent
from launch.redis_server import RedisServer, start_redis
from pdserve.roles import Role

__all__ = ["ClusterSpec", "LocalCluster", "Process"]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    ready_file: Path
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        """`sig` to the whole process group: the pdserve process and vLLM's engine processes."""
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def terminate(self) -> None:
        """SIGTERM to the pdserve process alone, as a container runtime's init (tini) sends it: a
        worker drains with its engine processes intact, then stops them itself."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> int:
        """Graceful: `terminate()`, SIGKILL to the group after `timeout_s`; its exit code. Whatever
        is left of the group once the process exited (an engine process it left behind) is killed."""
        self.terminate()
        try:
            code = self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            code = self.popen.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return code


class LocalCluster:
    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.log_dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="pdserve-logs-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis: RedisServer | None = None
        self.router: Process | None = None
        self.workers: dict[str, Process] = {}
        self._ids = itertools.count()
        self.grpc_target = ""
        self.http_url = ""

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 240.0) -> "LocalCluster":
        """Starts Redis, the router and the workers; returns once the router routes to every worker
        (a worker's ready file says it serves; the router learns of it at its next registry refresh,
        and a request sent in between would find no worker)."""
        try:
            deadline = time.monotonic() + timeout_s
            self.redis = start_redis()
            self.router = self._spawn("router", self.spec.router_argv(self.redis.url))
            for role, count in (("prefill", self.spec.num_prefill), ("decode", self.spec.num_decode)):
                for _ in range(count):
                    self.add_worker(role, wait=False)
            self.wait_ready([self.router, *self.workers.values()], timeout_s)
            self.grpc_target, self.http_url = self.router.ready_file.read_text().split()
            self.wait_routed(max(1.0, deadline - time.monotonic()))
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for process in [*self.workers.values(), self.router]:
            if process is not None:
                process.terminate()  # all drain at once; stop() below waits for each
        for process in [*self.workers.values(), self.router]:
            if process is not None:
                process.stop()
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- pools ---------------------------------------------------------------------------------
    def add_worker(self, role: Role, wait: bool = True, timeout_s: float = 240.0) -> str:
        worker_id = f"{role}-{next(self._ids)}"
        process = self._spawn(worker_id, self.spec.worker_argv(role, worker_id, self.redis.url))
        self.workers[worker_id] = process
        if wait:
            self.wait_ready([process], timeout_s)
        return worker_id

    def remove_worker(self, worker_id: str, timeout_s: float = 60.0) -> int:
        """Drains and stops the worker (SIGTERM); returns its exit code."""
        return self.workers.pop(worker_id).stop(timeout_s)

    def kill_worker(self, worker_id: str) -> None:
        """SIGKILL, as a crash: no drain, no deregistration."""
        process = self.workers.pop(worker_id)
        process.signal(signal.SIGKILL)
        process.popen.wait()

    def worker_ids(self, role: Role) -> list[str]:
        return [w for w in self.workers if w.startswith(role)]

    def worker_address(self, worker_id: str) -> str:
        return self.workers[worker_id].ready_file.read_text().strip()

    # ---- processes -----------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> Process:
        ready = self.log_dir / f"{name}.ready"
        ready.unlink(missing_ok=True)
        log_path = self.log_dir / f"{name}.log"
        env = os.environ | {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                            "PYTHONUNBUFFERED": "1"}
        popen = subprocess.Popen(pdserve_argv([*argv, "--ready-file", str(ready)]),
                                 stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, preexec_fn=die_with_parent())
        return Process(name, popen, ready, log_path)

    def wait_ready(self, processes: list[Process], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for process in processes:
            while not (process.ready_file.exists() and process.ready_file.read_text().strip()):
                if not process.alive():
                    raise RuntimeError(f"{process.name} exited with {process.popen.returncode}; "
                                       f"last log lines:\n{_tail(process.log_path)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{process.name} not ready within {timeout_s}s; log:\n{_tail(process.log_path)}")
                time.sleep(0.1)

    def wait_routed(self, timeout_s: float) -> None:
        """Waits until the router sees as many prefill and decode workers as the spec asks for."""
        from pdserve.client import Client

        deadline = time.monotonic() + timeout_s
        with Client(self.grpc_target) as client:
            while True:
                info = client.model_info()
                if info.num_prefill_workers >= self.spec.num_prefill and info.num_decode_workers >= self.spec.num_decode:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the router sees {info.num_prefill_workers} prefill and "
                                       f"{info.num_decode_workers} decode workers after {timeout_s:.0f} s, "
                                       f"not {self.spec.num_prefill} and {self.spec.num_decode}; logs in {self.log_dir}")
                time.sleep(0.05)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
