"""A worker's drain after SIGTERM: stop taking work, finish what it accepted, then let go.

Every step shares one deadline, `drain_timeout_s` after SIGTERM (a Kubernetes pod's
terminationGracePeriodSeconds must cover preStop + this + the engine's shutdown):

1. health NOT_SERVING and out of the registry: routers stop picking this worker within one
   registry refresh; a request routed just before still lands here and is served;
2. every request inside the RPC handlers finishes (a decode streams to its last token);
3. prefill only: the KV blocks it holds under leases for decode workers that have not pulled
   them yet are let go. The lease table lives in the engine's model-runner process; what this
   process sees of it is the engine's KV blocks in use (vLLM's scheduler stats, `EngineLoad`):
   above 0 while a lease holds blocks, back to 0 once each is pulled or expires (`lease_s`).
   Leaving earlier would stop the KV server under a decode worker about to pull.

Only after `drain()` may the caller stop the gRPC server and the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

logger = logging.getLogger("pdserve.worker")


def drained(role: str, num_inflight: int, kv_blocks_used: int) -> bool:
    """True once nothing more will be asked of this worker: no request in its handlers and, on a
    prefill worker, no KV block held for a consumer (a decode worker's blocks belong to its own
    requests, so in-flight is all it waits for)."""
    if num_inflight:
        return False
    return role != "prefill" or kv_blocks_used == 0


async def wait_drained(runtime, deadline_s: float, poll_s: float = 0.05) -> bool:
    """Polls `drained()` for `runtime` (a `WorkerRuntime`) until it holds or the monotonic clock
    passes `deadline_s`. True if drained."""
    while not drained(runtime.config.role, len(runtime.inflight), runtime.load.kv_blocks_used):
        if time.monotonic() >= deadline_s:
            return False
        await asyncio.sleep(poll_s)
    return True


async def drain(runtime, registry, health, heartbeat: asyncio.Task) -> bool:
    """Steps 1-3 above; `heartbeat` is the lease loop, already told to stop. True if the worker
    drained within `drain_timeout_s`; False (logged) if the deadline cut it short."""
    config = runtime.config
    started_s = time.monotonic()
    await health.enter_graceful_shutdown()
    await heartbeat
    try:
        await registry.deregister(config.worker_id)
    except (RedisError, OSError) as error:  # the lease lapses on its own within ttl_s
        logger.warning("could not leave the registry (%s); the lease lapses in %.1f s", error, config.ttl_s)
    if await wait_drained(runtime, started_s + config.drain_timeout_s):
        logger.info("drained in %.1f s", time.monotonic() - started_s)
        return True
    logger.warning("drain timed out after %.0f s with %d requests in flight and %d KV blocks held",
                   config.drain_timeout_s, len(runtime.inflight), runtime.load.kv_blocks_used)
    return False
