"""A live worker whose vLLM engine core process is SIGKILLed: it answers NOT_SERVING (or is gone),
leaves the registry itself (the lease is long, so a lapse cannot pass for it), and exits with a
non-zero code its supervisor acts on (`pdserve.worker.watchdog`).

One decode worker on the tiny model, started as the launchers start it (`launch.supervisor`)."""

from __future__ import annotations

import time

import grpc
import psutil
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from launch.commands import worker_argv
from launch.supervisor import pdserve_child
from pdserve.keys import worker_key
from pdserve.worker.watchdog import ENGINE_DEAD_EXIT_CODE

from cluster_helpers import engine_settings

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

TTL_S = 60.0         # the lease cannot lapse within the test: only a deregistration removes the entry
LEAVE_WITHIN_S = 10  # kill -> entry gone and process exited (vLLM notices within ~1 s, the watchdog 0.5 s)


def engine_core_of(pid: int) -> psutil.Process:
    """The worker's vLLM engine core: its child process vLLM titles `VLLM::EngineCore`."""
    cores = [child for child in psutil.Process(pid).children()
             if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline())]
    assert len(cores) == 1, f"expected one engine core among {[c.cmdline() for c in psutil.Process(pid).children()]}"
    return cores[0]


def health_status(address: str) -> str:
    """SERVING / NOT_SERVING, or UNAVAILABLE once nothing listens there."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError as error:
        return error.code().name


def test_a_worker_whose_engine_core_is_killed_says_not_serving_leaves_the_registry_and_exits_non_zero(
        tiny_model, redis_server, tmp_path):
    argv = worker_argv(role="decode", worker_id="decode-doomed", redis_url=redis_server.url, cluster="engine-death",
                       transport="tcp", cpu_cores="", lease_s=30.0, ttl_s=TTL_S, engine=engine_settings(tiny_model))
    worker = pdserve_child(argv, tmp_path, "decode-doomed").start()
    registry = redis.Redis.from_url(redis_server.url)
    key = worker_key("engine-death", "decode-doomed")
    try:
        address = worker.wait_ready(180)
        assert health_status(address) == "SERVING" and registry.exists(key)

        engine_core_of(worker.pid).kill()
        killed_at = time.monotonic()
        seen, gone_at = [], None
        while worker.alive() and time.monotonic() - killed_at < LEAVE_WITHIN_S + 20:
            status = health_status(address)
            if not seen or seen[-1] != status:
                seen.append(status)
            if gone_at is None and not registry.exists(key):
                gone_at = time.monotonic()
            time.sleep(0.05)
        exit_code = worker.wait(5)
        exited_at = time.monotonic()
    finally:
        worker.stop(10)

    assert exit_code == ENGINE_DEAD_EXIT_CODE, worker.log_tail()
    assert exited_at - killed_at < LEAVE_WITHIN_S, worker.log_tail()
    assert not registry.exists(key)
    assert gone_at is None or gone_at - killed_at < LEAVE_WITHIN_S
    # never SERVING again once it said otherwise: SERVING (not noticed yet), then NOT_SERVING and/or gone
    assert seen[seen.index("SERVING") + 1 if "SERVING" in seen else 0:] in (
        [], ["NOT_SERVING"], ["UNAVAILABLE"], ["NOT_SERVING", "UNAVAILABLE"]), seen
