"""The router's view of the workers: the registry, refreshed in the background, plus local state.

Routing never waits on Redis: `refresh()` runs every `refresh_s` and replaces the snapshot.
A worker that fails an RPC is quarantined for `quarantine_s` (its registry lease may not have
lapsed yet), so retries go elsewhere at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter

import grpc
from redis.exceptions import RedisError

from pdserve.registry import Registry, WorkerRecord
from pdserve.v1 import worker_pb2_grpc
from router.policies.least_loaded import Candidate, pick_least_loaded

logger = logging.getLogger(__name__)


class WorkerPool:
    def __init__(self, registry: Registry, refresh_s: float = 0.25, quarantine_s: float = 5.0):
        self.registry = registry
        self.refresh_s = refresh_s
        self.quarantine_s = quarantine_s
        self._workers: dict[str, WorkerRecord] = {}
        self._inflight: Counter[str] = Counter()
        self._quarantined: dict[str, float] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, worker_pb2_grpc.WorkerStub] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for channel in self._channels.values():
            await channel.close()

    async def refresh(self) -> None:
        records = await self.registry.workers()
        self._workers = {r.worker_id: r for r in records if not r.draining}

    async def _refresh_loop(self) -> None:
        """Refreshes until cancelled. While Redis is away the last snapshot stays (the workers in it
        still serve; one that fails an RPC is quarantined); the first refresh after it is back
        replaces it. A failure is logged when it starts and when it ends."""
        failing = False
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
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

    def stub(self, worker: WorkerRecord) -> worker_pb2_grpc.WorkerStub:
        """One channel and stub per worker address, reused by every request (a stub builds a
        callable per RPC: cheap, but on the path of every request)."""
        stub = self._stubs.get(worker.grpc_address)
        if stub is None:
            channel = grpc.aio.insecure_channel(worker.grpc_address)
            self._channels[worker.grpc_address] = channel
            stub = self._stubs[worker.grpc_address] = worker_pb2_grpc.WorkerStub(channel)
        return stub
