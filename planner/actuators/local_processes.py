"""`pdserve worker` processes the planner starts next to a running cluster (found by its Redis).

The `WorkerBackend` of `planner.actuators.local.LocalActuator` for `pdserve planner --actuator
local`: the cluster (router, first workers) was started by someone else, e.g. `pdserve up`; these
workers join it through the registry exactly as `pdserve up`'s own do. Each worker is a
`launch.supervisor.ChildProcess` (one process group); `stop_all()` drains them all (the planner owns
them). The actuator calls `add_worker` from a worker thread of the planner's event loop; the
supervisor still ties each worker to the planner *process*: if the planner dies, even by SIGKILL,
its workers get SIGTERM (they deregister and drain) rather than serve on as orphans.

CPU placement: `cpu_cores` gives each role a rotation of core sets; a new worker takes the first
set no live worker of its role holds (else the least used), so on a 2-core host a second decode
worker can go to the core the first one does not use.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kv_transfer.transports.base import TRANSPORTS
from launch.commands import worker_argv
from launch.supervisor import ChildProcess, pdserve_child
from pdserve.engine import EngineSettings
from planner.actuators.base import ROLES, Role


@dataclass(frozen=True)
class WorkerLaunchSpec:
    redis_url: str
    cluster: str
    engine: EngineSettings
    transport: str = "auto"
    cpu_cores: dict[str, tuple[str, ...]] = field(default_factory=dict)  # role -> core sets, e.g. ("1", "0")
    lease_s: float = 30.0
    ttl_s: float = 3.0
    log_dir: str = ""
    id_prefix: str = "planned"
    cluster_secret_file: str = ""   # the cluster secret (a path); "" when the cluster has none
    redis_password_file: str = ""   # the cluster's Redis password (a path); "" when its Redis has none

    def __post_init__(self) -> None:
        if not self.redis_url:
            raise ValueError("redis_url is empty: give the cluster's registry, e.g. redis://127.0.0.1:6379/0")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)} (the cluster's), got {self.transport!r}")
        unknown = set(self.cpu_cores) - set(ROLES)
        if unknown:
            raise ValueError(f"cpu_cores has roles {sorted(unknown)}; use prefill and/or decode")


class WorkerProcesses:
    """Starts, lists and drains worker processes. Not thread-safe for concurrent adds; the
    actuator serializes them (removals may run in other threads)."""

    def __init__(self, spec: WorkerLaunchSpec) -> None:
        self.spec = spec
        self.log_dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="pdserve-planner-workers-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._processes: dict[str, ChildProcess] = {}
        self._cores: dict[str, str] = {}
        self._ids = itertools.count()

    def add_worker(self, role: Role, wait: bool = True, timeout_s: float = 240.0) -> str:
        worker_id = f"{role}-{self.spec.id_prefix}-{os.getpid()}-{next(self._ids)}"
        cores = self._pick_cores(role)
        self._processes[worker_id] = pdserve_child(self._argv(role, worker_id, cores), self.log_dir, worker_id).start()
        self._cores[worker_id] = cores
        if wait:
            self.wait_ready(worker_id, timeout_s)
        return worker_id

    def wait_ready(self, worker_id: str, timeout_s: float = 240.0) -> str:
        """Until the worker wrote its ready file (it serves and is registered); its address.
        ChildExited (with its log) if it exited first, TimeoutError after `timeout_s`."""
        return self._processes[worker_id].wait_ready(timeout_s)

    def remove_worker(self, worker_id: str, timeout_s: float = 90.0) -> int:
        """SIGTERM: the worker drains (finishes in-flight requests) and exits; returns its exit code."""
        process = self._processes.pop(worker_id)
        self._cores.pop(worker_id, None)
        return process.stop(timeout_s)

    def worker_ids(self, role: Role) -> list[str]:
        """Live workers of `role` (starting or serving), oldest first; exited ones are forgotten."""
        for worker_id, process in list(self._processes.items()):
            if not process.alive():
                self._processes.pop(worker_id, None)
                self._cores.pop(worker_id, None)
        return [w for w in self._processes if w.startswith(f"{role}-")]

    def stop_all(self) -> None:
        for worker_id in list(self._processes):
            self.remove_worker(worker_id)

    def _pick_cores(self, role: Role) -> str:
        choices = self.spec.cpu_cores.get(role, ())
        if not choices:
            return ""
        used = Counter(self._cores[w] for w in self.worker_ids(role))
        return min(choices, key=lambda cores: (used[cores], choices.index(cores)))

    def _argv(self, role: Role, worker_id: str, cores: str) -> list[str]:
        s = self.spec
        return worker_argv(role=role, worker_id=worker_id, redis_url=s.redis_url, cluster=s.cluster,
                           transport=s.transport, cpu_cores=cores, lease_s=s.lease_s, ttl_s=s.ttl_s, engine=s.engine,
                           cluster_secret_file=s.cluster_secret_file, redis_password_file=s.redis_password_file)
