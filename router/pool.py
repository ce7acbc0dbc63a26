"""The router's view of the workers: the registry, refreshed in the background, plus local state.

Routing never waits on Redis: `refresh()` runs every `refresh_s` and replaces the snapshot, and
reads the topology the online planner published for the cluster (`published_topology`: None
while none is, or when what is there is not a topology, which is logged once).
A worker that fails an RPC is quarantined for `quarantine_s` (its registry lease may not have
lapsed yet), so retries go elsewhere at once. `client(worker)` hands out one `WorkerClient` per
worker address, made by `connect(address)` (gRPC by default: one channel per address, reused by
every request) and closed with the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Callable

from redis.exceptions import RedisError

from pdserve.registry import Registry, WorkerRecord
from pdserve.roles import TOPOLOGIES, Topology
from router.grpc_worker_client import GrpcWorkerClient
from router.policies.least_loaded import Candidate, pick_least_loaded
from router.worker_client import WorkerClient

logger = logging.getLogger(__name__)


class WorkerPool:
    def __init__(self, registry: Registry, refresh_s: float = 0.25, quarantine_s: float = 5.0,
                 connect: Callable[[str], WorkerClient] = GrpcWorkerClient, recovery_s: float = 3.0):
        self.registry = registry
        self.connect = connect
        self.refresh_s = refresh_s
        self.quarantine_s = quarantine_s
        self.recovery_s = recovery_s   # after a registry outage: how long unlisted workers are kept (>= a worker's TTL)
        self._recovering_until_s = float("-inf")
        self._workers: dict[str, WorkerRecord] = {}
        self._inflight: Counter[str] = Counter()
        self._quarantined: dict[str, float] = {}
        self._clients: dict[str, WorkerClient] = {}   # grpc address -> its client
        self._task: asyncio.Task | None = None
        self.published_topology: Topology | None = None
        self._refused_topology: str | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    async def refresh(self, after_outage: bool = False) -> None:
        """Replaces the snapshot with the registry's. `after_outage`: the first read since Redis was
        unreachable; Redis may be back empty (restarted), with the workers re-registering one by one
        at their next heartbeat, so for `recovery_s` a worker of the last snapshot the registry does
        not list yet is kept (as after a registry found empty at once: a reset)."""
        records = await self.registry.workers()
        now_s = time.monotonic()
        reset = not records and self._workers and self._recovering_until_s < now_s - self.recovery_s
        if after_outage or reset:
            self._recovering_until_s = now_s + self.recovery_s
        self._workers = refreshed_snapshot(self._workers, records, keep_missing=now_s < self._recovering_until_s)
        self.published_topology = self._checked_topology(await self.registry.topology())

    def _checked_topology(self, value: str | None) -> Topology | None:
        if value is None or value in TOPOLOGIES:
            return value  # type: ignore[return-value]
        if value != self._refused_topology:
            logger.warning("ignoring the published topology %r: not one of %s", value, ", ".join(TOPOLOGIES))
            self._refused_topology = value
        return None

    async def _refresh_loop(self) -> None:
        """Refreshes until cancelled. While Redis is away the last snapshot stays (the workers in it
        still serve; one that fails an RPC is quarantined); the first refresh after it is back
        replaces it. A failure is logged when it starts and when it ends."""
        failing = False
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh(after_outage=failing)
            except (RedisError, OSError) as error:
                if not failing:
                    logger.warning("registry refresh failed (%s); routing on the last snapshot", error)
                failing = True
            else:
                if failing:
                    logger.info("registry reachable again: %d workers", len(self._workers))
                failing = False

    def workers(self, role: str) -> list[WorkerRecord]:
        now = time.monotonic()
        return [w for w in self._workers.values()
                if w.role == role and self._quarantined.get(w.worker_id, 0.0) <= now]

    def pick(self, role: str, exclude: frozenset[str] = frozenset()) -> WorkerRecord | None:
        records = {w.worker_id: w for w in self.workers(role)}
        candidates = [
            Candidate(w.worker_id, w.num_running + w.num_waiting,
                      w.kv_blocks_used / w.kv_blocks_total if w.kv_blocks_total else 0.0, self._inflight[w.worker_id])
            for w in records.values()
        ]
        chosen = pick_least_loaded(candidates, exclude)
        return records[chosen.worker_id] if chosen else None

    def registered_ids(self) -> set[str]:
        """Every worker in the registry and not draining, quarantined ones included (a quarantined
        worker is still there, its cache with it)."""
        return set(self._workers)

    def get(self, worker_id: str) -> WorkerRecord | None:
        """The live, unquarantined worker `worker_id`, or None."""
        record = self._workers.get(worker_id)
        if record is None or self._quarantined.get(worker_id, 0.0) > time.monotonic():
            return None
        return record

    def inflight(self, worker_id: str) -> int:
        """Calls this router has in flight at `worker_id` (exact, current)."""
        return self._inflight[worker_id]

    def load_rows(self) -> list[tuple[str, str, int, int, float, int]]:
        """(worker_id, role, num_running, num_waiting, kv usage, this router's calls in flight) of
        every registered worker, quarantined ones included: `pdserve.metrics.WorkerLoadCollector`'s rows."""
        return [(w.worker_id, w.role, w.num_running, w.num_waiting,
                 w.kv_blocks_used / w.kv_blocks_total if w.kv_blocks_total else 0.0, self._inflight[w.worker_id])
                for w in self._workers.values()]

    @contextlib.contextmanager
    def track(self, worker: WorkerRecord):
        self._inflight[worker.worker_id] += 1
        try:
            yield
        finally:
            self._inflight[worker.worker_id] -= 1

    def quarantine(self, worker: WorkerRecord) -> None:
        logger.warning("worker %s (%s) failed; not routing to it for %.0fs", worker.worker_id,
                       worker.grpc_address, self.quarantine_s)
        self._quarantined[worker.worker_id] = time.monotonic() + self.quarantine_s

    def client(self, worker: WorkerRecord) -> WorkerClient:
        """The client of `worker`'s address, made on first use and reused by every request."""
        client = self._clients.get(worker.grpc_address)
        if client is None:
            client = self._clients[worker.grpc_address] = self.connect(worker.grpc_address)
        return client


def refreshed_snapshot(previous: dict[str, WorkerRecord], records: list[WorkerRecord],
                       keep_missing: bool) -> dict[str, WorkerRecord]:
    """The pool's workers after a registry read: the registry's, draining ones left out. While
    `keep_missing` (the registry is recovering from an outage or a reset, and workers re-register
    at their next heartbeat), a worker of `previous` the registry does not list yet is kept; one
    it lists as draining is not. A kept worker that is in fact dead fails its first RPC and is
    quarantined, as any other."""
    current = {record.worker_id: record for record in records if not record.draining}
    if keep_missing:
        listed = {record.worker_id for record in records}
        current.update((worker_id, record) for worker_id, record in previous.items() if worker_id not in listed)
    return current
