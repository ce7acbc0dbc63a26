"""The topology the online planner publishes for a cluster reaches every router at its next
registry refresh and overrides the router's own --topology (a real redis-server)."""

from __future__ import annotations

import asyncio
import time

from pdserve.registry import Registry, WorkerRecord
from router.live_view import LiveView
from router.policies.placement import PlacementConfig
from router.pool import WorkerPool


async def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s")
        await asyncio.sleep(0.02)


async def test_a_published_topology_switches_the_local_path_of_a_running_router(redis_server):
    registry = Registry(redis_server.url, "published-topology")
    pool = WorkerPool(registry, refresh_s=0.02)
    try:
        await registry.heartbeat(WorkerRecord("prefill-1", "prefill", "tiny", "10.0.0.1:1"), ttl_s=60)
        await registry.heartbeat(WorkerRecord("decode-1", "decode", "tiny", "10.0.0.2:1"), ttl_s=60)
        await pool.start()
        view = LiveView(pool, "disaggregated", PlacementConfig())

        def local_allowed() -> bool:
            return {v.worker_id: v.accepts_local_prefill for v in view.views([1, 2, 3])}["decode-1"]

        assert not local_allowed() and view.computing_workers() == 1  # the router's own topology
        await registry.set_topology("hybrid")
        await wait_for(local_allowed, 5, "the router to place for the published hybrid topology")
        assert view.computing_workers() == 2 and view.rule.topology == "hybrid"

        await registry.set_topology("no-such-topology")  # not a topology: ignored, the router's own again
        await wait_for(lambda: not local_allowed(), 5, "the router to ignore a value that is no topology")
        await registry.redis.delete("pdserve:published-topology:topology")
        await wait_for(lambda: pool.published_topology is None, 5, "the router to forget the topology")
        assert view.rule.topology == "disaggregated"
    finally:
        await pool.close()
        await registry.close()
