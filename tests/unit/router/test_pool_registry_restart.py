"""The router's registry refresh survives Redis going away and coming back (a real redis-server)."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import RedisError

from launch.redis_server import start_redis
from pdserve.registry import Registry, WorkerRecord
from router.pool import WorkerPool, refreshed_snapshot


async def wait_for(predicate, timeout_s: float, what: str, between=None) -> None:
    """Polls `predicate` every 50 ms until it holds (`between`: a coroutine function awaited before
    each new look, e.g. a refresh by hand); TimeoutError naming `what` past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s")
        await asyncio.sleep(0.05)
        if between is not None:
            await between()


def decode_ids(pool: WorkerPool) -> list[str]:
    return sorted(w.worker_id for w in pool.workers("decode"))


async def test_refresh_keeps_the_last_snapshot_while_redis_is_down_and_resumes_after_a_restart():
    server = start_redis()
    port = server.port
    registry = Registry(server.url, "default")
    pool = WorkerPool(registry, refresh_s=0.05)
    try:
        await registry.heartbeat(WorkerRecord("decode-1", "decode", "tiny", "10.0.0.1:50061"), ttl_s=60)
        await pool.start()
        assert decode_ids(pool) == ["decode-1"]

        server.stop()
        with pytest.raises(RedisError):
            await pool.refresh()   # the registry is gone, as the background refresh finds it every 50 ms
        assert decode_ids(pool) == ["decode-1"]  # routing goes on with what it knew

        server = start_redis(port=port)  # an empty Redis; workers register again on their next beat
        await registry.heartbeat(WorkerRecord("decode-2", "decode", "tiny", "10.0.0.2:50061"), ttl_s=60)
        await wait_for(lambda: decode_ids(pool) == ["decode-2"], 10, "the refresh to see the new registry")
    finally:
        await pool.close()
        await registry.close()
        server.stop()


async def test_the_first_read_after_an_outage_keeps_the_workers_that_have_not_re_registered_yet():
    """Redis back empty, one worker re-registered before the router's first read: the other one
    (alive, its heartbeat not due yet) stays routable for `recovery_s`, then goes if still unlisted."""
    server = start_redis()
    port = server.port
    registry = Registry(server.url, "default")
    pool = WorkerPool(registry, recovery_s=0.3)   # refreshed by hand below: no background loop
    try:
        for worker_id, role in (("prefill-1", "prefill"), ("decode-1", "decode")):
            await registry.heartbeat(WorkerRecord(worker_id, role, "tiny", "10.0.0.1:1"), ttl_s=60)
        await pool.refresh()
        server.stop()
        with pytest.raises(RedisError):
            await pool.refresh()   # the outage, as the refresh loop sees it
        server = start_redis(port=port)
        worker = Registry(server.url, "default")   # the decode worker's own client, beating first
        await worker.heartbeat(WorkerRecord("decode-1", "decode", "tiny", "10.0.0.1:1"), ttl_s=60)
        await worker.close()
        await pool.refresh(after_outage=True)
        assert [w.worker_id for w in pool.workers("prefill")] == ["prefill-1"]   # kept while it re-registers
        await wait_for(lambda: not pool.workers("prefill"), 10, "the unlisted worker to go after the recovery "
                       "window", between=pool.refresh)   # never came back: gone after the window
        await pool.refresh(after_outage=False)
        assert decode_ids(pool) == ["decode-1"]
    finally:
        await pool.close()
        await registry.close()
        server.stop()


def test_while_the_registry_recovers_unlisted_workers_are_kept_and_draining_ones_dropped():
    a, b, c = (WorkerRecord(f"decode-{x}", "decode", "tiny", f"10.0.0.{i}:1") for i, x in enumerate("abc"))
    previous = {w.worker_id: w for w in (a, b, c)}
    b_draining = WorkerRecord("decode-b", "decode", "tiny", "10.0.0.1:1", draining=True)
    assert refreshed_snapshot(previous, [a, b_draining], keep_missing=True) == {"decode-a": a, "decode-c": c}
    assert refreshed_snapshot(previous, [a], keep_missing=False) == {"decode-a": a}   # steady state: gone is gone
    assert refreshed_snapshot(previous, [], keep_missing=True) == previous
