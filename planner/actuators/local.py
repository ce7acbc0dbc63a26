"""Resize the pools by starting and stopping `pdserve worker` processes on this host.

The processes come from a `WorkerBackend`: `launch.local.LocalCluster` (the cluster `pdserve
up` runs, so `up --planner` can pass itself) or `planner.actuators.local_processes.WorkerProcesses`
(workers added next to a cluster started elsewhere, found through its Redis). Workers the
backend did not start (`unmanaged`) count toward a pool's size but are never removed.

Contract (planner/actuators/base.py):
- `current()` is unmanaged + the backend's workers that are starting or serving and not being
  removed: the size last asked for, not how many serve now;
- `scale(role, n)` starts workers without waiting for them to serve (~20 s for an engine) and
  removes the newest first (a still-starting one before a serving one) by SIGTERM in a background
  thread: the worker leaves the registry, finishes its in-flight requests, then exits, so no
  request is dropped; it is idempotent;
- asking for fewer than the unmanaged workers raises `LocalScaleError`.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from planner.actuators.base import ROLES, Role
from planner.pool_sizes import PoolSizes

logger = logging.getLogger(__name__)


class LocalScaleError(RuntimeError):
    """The local backend cannot reach the asked size; the message says what to fix."""


class WorkerBackend(Protocol):
    def add_worker(self, role: Role, wait: bool = True) -> str:
        """Start a worker; return its id at once when `wait` is False."""
        ...

    def remove_worker(self, worker_id: str) -> int:
        """SIGTERM (drain) and wait for the exit; returns the exit code."""
        ...

    def worker_ids(self, role: Role) -> list[str]:
        """This backend's workers of `role`, oldest first."""
        ...


class LocalActuator:
    def __init__(self, backend: WorkerBackend, unmanaged: PoolSizes = PoolSizes(0, 0)) -> None:
        self.backend = backend
        self.unmanaged = unmanaged
        self._removing: set[str] = set()
        self._drains: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _managed(self, role: Role) -> list[str]:
        with self._lock:
            return [w for w in self.backend.worker_ids(role) if w not in self._removing]

    def current(self) -> dict[Role, int]:
        return {role: self.unmanaged.of(role) + len(self._managed(role)) for role in ROLES}

    def scale(self, role: Role, replicas: int) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas for {role} must be an int >= 0, got {replicas!r}")
        floor = self.unmanaged.of(role)
        if replicas < floor:
            raise LocalScaleError(
                f"cannot shrink the {role} pool to {replicas}: {floor} of its workers were started outside "
                f"the planner and are never removed; set the planner's --min-{role} to at least {floor}")
        managed = self._managed(role)
        for _ in range(replicas - floor - len(managed)):
            worker_id = self.backend.add_worker(role, wait=False)
            logger.info("started %s worker %s", role, worker_id)
        for worker_id in reversed(managed[replicas - floor:]):
            self._remove(worker_id)

    def _remove(self, worker_id: str) -> None:
        with self._lock:
            self._removing.add(worker_id)
        thread = threading.Thread(target=self._drain, args=(worker_id,), name=f"drain-{worker_id}", daemon=True)
        self._drains.append(thread)
        thread.start()

    def _drain(self, worker_id: str) -> None:
        try:
            code = self.backend.remove_worker(worker_id)
            logger.info("worker %s drained and exited with %s", worker_id, code)
        finally:
            with self._lock:
                self._removing.discard(worker_id)

    def wait_for_drains(self, timeout_s: float = 120.0) -> None:
        """Block until every removal started so far has finished (tests, shutdown)."""
        for thread in list(self._drains):
            thread.join(timeout_s)
        self._drains = [t for t in self._drains if t.is_alive()]
