"""LiveView keeps the router's prefix index true to the pool: a worker that left the registry is
forgotten, and each worker's capacity is its engine's KV blocks (a registry stand-in feeds a real
WorkerPool)."""

import asyncio

from pdserve.registry import WorkerRecord
from router.live_view import LiveView
from router.policies.placement import PlacementConfig
from router.pool import WorkerPool


class Registry:
    def __init__(self, records):
        self.records = records

    async def workers(self):
        return list(self.records)

    async def topology(self):
        return None


def _record(worker_id, kv_blocks_total=0):
    return WorkerRecord(worker_id=worker_id, role="decode", model="m", grpc_address="127.0.0.1:1", block_size=4,
                        kv_blocks_total=kv_blocks_total)


def test_a_departed_worker_is_forgotten_and_a_live_one_gets_its_engines_capacity():
    registry = Registry([_record("d1", kv_blocks_total=3), _record("d2")])
    pool = WorkerPool(registry)
    asyncio.run(pool.refresh())
    view = LiveView(pool, "aggregated", PlacementConfig(), prefix_capacity_blocks=100)
    prompt = list(range(40))   # 10 blocks of 4
    index = view.prefix(4)
    index.record("d1", prompt)
    index.record("d2", prompt)
    cached = {v.worker_id: v.cached_prefix_tokens for v in view.views(prompt)}
    assert cached == {"d1": 12, "d2": 40}          # d1's engine holds 3 blocks: the index keeps 3
    registry.records = [_record("d1", kv_blocks_total=3)]   # d2 left the registry
    asyncio.run(pool.refresh())
    view.views(prompt)
    assert index.workers() == ["d1"] and index.blocks_of("d2") == 0
