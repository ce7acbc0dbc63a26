"""The worker's registry lease and metrics, with a real redis-server and a real HTTP scrape (no
engine: the heartbeat reads the load the engine's stats would have filled in)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis

from pdserve.engine import EngineSettings
from pdserve.metrics import start_metrics_server
from launch.redis_server import start_redis
from pdserve.keys import worker_key
from pdserve.registry import Registry
from pdserve.worker.config import WorkerConfig
from pdserve.worker.heartbeat import heartbeat_loop, worker_record
from pdserve.worker.load import EngineLoad
from pdserve.worker.server import WorkerRuntime

TTL_S = 0.6


def make_runtime(redis_url: str, **load) -> WorkerRuntime:
    config = WorkerConfig(role="prefill", engine=EngineSettings(model="/models/tiny"), redis_url=redis_url,
                          worker_id="prefill-7", heartbeat_s=0.1, ttl_s=TTL_S)
    return WorkerRuntime(config, engine=None, load=EngineLoad(**load), kv_address="10.0.0.7:14579")


async def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s")
        await asyncio.sleep(0.05)


async def test_heartbeat_outlives_a_redis_restart_and_registers_again():
    server = start_redis()
    port = server.port
    runtime = make_runtime(server.url)
    registry = Registry(server.url, "default")
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat_loop(registry, runtime, "10.0.0.7:50061", stop))
    key = worker_key("default", "prefill-7")
    try:
        await wait_for(lambda: redis.Redis(port=port).exists(key), 5, "the first registration")
        server.stop()                      # Redis goes away: every beat now fails
        await asyncio.sleep(5 * runtime.config.heartbeat_s)
        assert not loop.done(), "a Redis error ended the heartbeat loop"
        server = start_redis(port=port)    # back, empty: the next beat registers the worker again
        await wait_for(lambda: redis.Redis(port=port).exists(key), 5, "registration after the restart")
        record = redis.Redis(port=port, decode_responses=True).hgetall(key)
        assert (record["role"], record["grpc_address"], record["kv_address"]) == (
            "prefill", "10.0.0.7:50061", "10.0.0.7:14579")
    finally:
        stop.set()
        await loop
        await registry.close()
        server.stop()


async def test_stop_ends_the_loop_even_while_redis_is_down(caplog):
    server = start_redis()
    runtime = make_runtime(server.url)
    registry = Registry(server.url, "default")
    server.stop()
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat_loop(registry, runtime, "10.0.0.7:50061", stop))
    await wait_for(lambda: "registry heartbeat failed" in caplog.text, 10, "a heartbeat against the stopped server")
    stop.set()
    assert await asyncio.wait_for(loop, timeout=10) is None   # it ends, it does not raise
    await registry.close()


async def test_metrics_port_serves_the_worker_gauges_over_http(redis_server):
    runtime = make_runtime(redis_server.url, num_running=3, num_waiting=2, kv_blocks_used=17, kv_blocks_total=512)
    runtime.inflight.update({"r1": "t1", "r2": "t2"})
    metrics = start_metrics_server("127.0.0.1", 0)
    registry = Registry(redis_server.url, "default")
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat_loop(registry, runtime, "10.0.0.7:50061", stop))
    expected = {"pdserve_worker_num_running": 3, "pdserve_worker_num_waiting": 2,
                "pdserve_worker_kv_blocks_used": 17, "pdserve_worker_kv_blocks_total": 512,
                "pdserve_worker_num_inflight": 2}
    deadline = time.monotonic() + 10  # the first beat publishes the gauges; a loaded host may delay it
    try:
        async with httpx.AsyncClient() as client:
            while True:
                response = await client.get(f"http://127.0.0.1:{metrics.server_port}/metrics", timeout=5)
                # the gauges; the router's pdserve_worker_failures_total may be in this process too
                samples = {line.split()[0]: float(line.split()[1]) for line in response.text.splitlines()
                           if line.split(" ")[0] in expected}
                if samples == expected or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await loop
        await registry.close()
        metrics.shutdown()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert samples == {"pdserve_worker_num_running": 3, "pdserve_worker_num_waiting": 2,
                       "pdserve_worker_kv_blocks_used": 17, "pdserve_worker_kv_blocks_total": 512,
                       "pdserve_worker_num_inflight": 2}


def test_a_negative_drain_timeout_is_refused():
    with pytest.raises(ValueError, match="drain_timeout_s must be >= 0"):
        WorkerConfig(role="decode", engine=EngineSettings(model="m"), redis_url="redis://h:1/0", drain_timeout_s=-1)


async def test_a_redis_that_accepts_but_never_answers_costs_a_failed_heartbeat_not_a_hang(monkeypatch):
    # a server paused (or behind a silent network) keeps the connection open and answers nothing:
    # every call must end within the client's bound with a RedisError the heartbeat loop retries
    import pdserve.registry
    from redis.exceptions import RedisError

    monkeypatch.setattr(pdserve.registry, "REDIS_TIMEOUT_S", 0.3)
    connections: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.read(1 << 16)   # takes the command, answers nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    registry = Registry(f"redis://127.0.0.1:{port}", "silent")
    runtime = make_runtime(f"redis://127.0.0.1:{port}")
    try:
        started = time.monotonic()
        with pytest.raises(RedisError):   # unbounded (redis-py < 8): asyncio's TimeoutError after 5 s instead
            await asyncio.wait_for(registry.heartbeat(worker_record(runtime, "10.0.0.7:1"), TTL_S), 5.0)
        assert connections and time.monotonic() - started < 3.0   # the 0.3 s bound, with a slow host's margin
        stop = asyncio.Event()
        loop = asyncio.create_task(heartbeat_loop(registry, runtime, "10.0.0.7:1", stop))
        # each failed heartbeat drops its connection and the next one dials again: retried, not hung
        await wait_for(lambda: len(connections) >= 3 or loop.done(), 10, "the heartbeat to retry twice")
        assert not loop.done()   # the loop neither raised nor returned while Redis stayed silent
        stop.set()
        assert await asyncio.wait_for(loop, 3.0) is None
    finally:
        for writer in connections:
            writer.close()
        server.close()
        await registry.close()
