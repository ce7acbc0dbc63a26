"""A worker whose engine died (`pdserve.worker.watchdog`): the decision with plain values, the
leaving against a real redis-server, a real heartbeat loop and a real gRPC health service. The
real engine's death (its core process SIGKILLed) is tests/chaos/test_engine_death.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from vllm.v1.engine.exceptions import EngineDeadError

from pdserve.engine import EngineSettings
from pdserve.keys import worker_key
from pdserve.registry import Registry
from pdserve.worker.config import WorkerConfig
from pdserve.worker.heartbeat import heartbeat_loop
from pdserve.worker.load import EngineLoad
from pdserve.worker.server import WorkerRuntime
from pdserve.worker.watchdog import (ENGINE_DEAD_EXIT_CODE, LEAVE_STEPS, SERVING, EngineObservation,
                                     EngineWatchdog, judge, leave)


@pytest.mark.parametrize("errored, dead_error_seen", [(True, False), (False, True), (True, True)])
def test_either_sign_of_a_dead_engine_means_leave_in_order_and_exit_non_zero(errored, dead_error_seen):
    verdict = judge(EngineObservation(errored=errored, dead_error_seen=dead_error_seen))
    assert not verdict.serving
    assert verdict.steps == LEAVE_STEPS == ("not_serving", "stop_heartbeat", "deregister")
    assert verdict.exit_code == ENGINE_DEAD_EXIT_CODE != 0


def test_a_live_engine_keeps_serving_with_nothing_to_do():
    assert judge(EngineObservation(errored=False, dead_error_seen=False)) == SERVING
    assert (SERVING.steps, SERVING.exit_code) == ((), None)


async def test_a_reported_engine_dead_error_wakes_the_watchdog_at_once():
    engine = SimpleNamespace(errored=False)  # AsyncLLM's `errored`, not yet set by vLLM's monitor thread
    watchdog = EngineWatchdog(engine, interval_s=30.0)
    waiting = asyncio.create_task(watchdog.wait_dead())
    await asyncio.sleep(0.05)
    assert watchdog.report(ValueError("prompt too long")) is False  # a request's error says nothing of the engine
    assert not waiting.done()
    started = time.monotonic()
    assert watchdog.report(EngineDeadError()) is True
    verdict = await asyncio.wait_for(waiting, 1.0)
    assert time.monotonic() - started < 0.5
    assert verdict.reason == "a request failed with vLLM's EngineDeadError"


async def test_the_watchdog_notices_errored_within_its_interval():
    engine = SimpleNamespace(errored=False)
    watchdog = EngineWatchdog(engine, interval_s=0.05)
    waiting = asyncio.create_task(watchdog.wait_dead())
    await asyncio.sleep(0.2)
    assert not waiting.done()
    engine.errored = True
    verdict = await asyncio.wait_for(waiting, 1.0)
    assert verdict.exit_code == ENGINE_DEAD_EXIT_CODE


async def test_leaving_says_not_serving_then_deregisters_for_good_and_returns_the_exit_code(redis_server):
    config = WorkerConfig(role="decode", engine=EngineSettings(model="/models/tiny"), redis_url=redis_server.url,
                          worker_id="decode-dead", heartbeat_s=0.05, ttl_s=60.0)
    runtime = WorkerRuntime(config, engine=None, load=EngineLoad())
    registry = Registry(redis_server.url, "watchdog")
    key = worker_key("watchdog", "decode-dead")
    stop = asyncio.Event()
    heartbeat = asyncio.create_task(heartbeat_loop(registry, runtime, "127.0.0.1:1", stop))
    health = HealthServicer()
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    sync_redis = redis.Redis.from_url(redis_server.url)
    try:
        while not sync_redis.exists(key):
            await asyncio.sleep(0.02)
        verdict = judge(EngineObservation(errored=True))
        exit_code = await leave(verdict, health=health, heartbeat_stop=stop, heartbeat=heartbeat,
                                registry=registry, worker_id="decode-dead")
        assert exit_code == ENGINE_DEAD_EXIT_CODE
        assert heartbeat.done()
        await asyncio.sleep(0.3)  # six heartbeat periods: a beat still running would have re-registered
        assert not sync_redis.exists(key)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        stop.set()
        await heartbeat
        await server.stop(None)
        await registry.close()
