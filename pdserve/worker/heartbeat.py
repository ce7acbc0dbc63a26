"""A worker's registry lease and its Prometheus gauges, renewed every `heartbeat_s`.

The lease is the worker's hash in Redis with a TTL (`pdserve.registry`). The loop outlives any
Redis failure: while Redis is away the lease lapses, so routers stop sending work here (the
worker keeps serving what reaches it), and the first beat after Redis is back registers the
worker again. Only `stop` ends the loop.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from pdserve.metrics import WORKER_GAUGES
from pdserve.registry import Registry, WorkerRecord

logger = logging.getLogger("pdserve.worker")


def worker_record(runtime, grpc_address: str, draining: bool = False) -> WorkerRecord:
    """What the registry says about this worker now (`runtime` is a `WorkerRuntime`)."""
    load, config = runtime.load, runtime.config
    return WorkerRecord(
        worker_id=config.worker_id, role=config.role, model=runtime.model_name, grpc_address=grpc_address,
        kv_address=runtime.kv_address if config.role == "prefill" else "", engine_id=config.worker_id,
        max_model_len=config.engine.max_model_len, block_size=config.engine.block_size,
        num_running=load.num_running, num_waiting=load.num_waiting, num_inflight=len(runtime.inflight),
        kv_blocks_used=load.kv_blocks_used, kv_blocks_total=load.kv_blocks_total,
        pending_transfers=load.pending_transfers, draining=int(draining),
    )


def publish_gauges(record: WorkerRecord) -> None:
    """Sets the `pdserve_worker_*` gauges served on the worker's --metrics-port."""
    for name, gauge in WORKER_GAUGES.items():
        gauge.set(getattr(record, name))


async def heartbeat_loop(registry: Registry, runtime, grpc_address: str, stop: asyncio.Event) -> None:
    """Renews the lease and the gauges every `heartbeat_s` until `stop` is set. A Redis error is
    logged once when it starts and once when it ends, never raised."""
    config = runtime.config
    failing = False
    while not stop.is_set():
        record = worker_record(runtime, grpc_address)
        publish_gauges(record)
        try:
            await registry.heartbeat(record, config.ttl_s)
        except (RedisError, OSError) as error:
            if not failing:
                logger.warning("registry heartbeat failed (%s); still serving, retrying every %.1f s",
                               error, config.heartbeat_s)
            failing = True
        else:
            if failing:
                logger.info("registry reachable again: %s registered", config.worker_id)
            failing = False
        try:
            await asyncio.wait_for(stop.wait(), config.heartbeat_s)
        except asyncio.TimeoutError:
            pass
