"""The control plane killed under load (issue 18 item 4), on one cluster (1 prefill + 1 decode,
2 s registry TTL, 3 s KV lease); the tests run in order:

- Redis SIGKILLed while requests flow: the router routes on its last registry snapshot and the
  workers keep serving; Redis restarted (empty, same port and password): every worker is back in
  the registry within its heartbeat, and the router sees them;
- the router SIGKILLed mid-stream: the client's stream ends at once with a clean UNAVAILABLE (no
  hang); the KV the prefill worker held for requests the dead router will never pull is freed by
  its lease; a call made while the router is down is retried by the SDK and served once the
  router is back on its ports;
- a router restarting binds its gRPC port before it imports vLLM and holds the calls that reach it
  until it serves: such a call succeeds with no SDK retry at all.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.client import Client, NoHealthyWorker
from pdserve.keys import worker_key

from cluster_helpers import start_cluster, wait_until_idle

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

TTL_S = 2.0
LEASE_S = 3.0


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("control-plane"), "tcp", ttl_s=TTL_S, lease_s=LEASE_S)
    yield cluster
    cluster.stop()


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.05)


def _registered(cluster) -> set[str]:
    client = redis.Redis.from_url(cluster.redis.client_url)
    return {w for w in cluster.workers if client.exists(worker_key("default", w))}


class _Traffic:
    """Sequential short requests from one thread until stopped; counts what succeeded and failed."""

    def __init__(self, cluster):
        self.cluster, self.ok, self.failed = cluster, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.cluster.grpc_target) as client:
            while not self._stop.is_set():
                try:
                    chunks = list(client.generate("steady traffic", max_tokens=6, temperature=0, ignore_eos=True))
                    assert sum(len(c.token_ids) for c in chunks) == 6
                    self.ok += 1
                except Exception as error:  # noqa: BLE001 - every failure is a finding
                    self.failed.append(repr(error))

    def __enter__(self) -> "_Traffic":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_serving_goes_on_without_redis_and_workers_re_register_when_it_returns(cluster):
    assert _registered(cluster) == set(cluster.workers)
    with _Traffic(cluster) as traffic:
        _wait_for(lambda: traffic.ok >= 3, 60, "traffic served")
        served_before = traffic.ok
        cluster.kill_redis()
        down_until = time.monotonic() + TTL_S + 2.0   # longer than a lease: only the snapshot routes now
        _wait_for(lambda: time.monotonic() >= down_until and traffic.ok >= served_before + 3, 60,
                  "traffic served without Redis")
        cluster.restart_redis()
        seen = []   # (prefill, decode) workers in the router's view, from Redis's return on
        with Client(cluster.grpc_target) as client:
            def back_in_both_views() -> bool:
                info = client.model_info()
                seen.append((info.num_prefill_workers, info.num_decode_workers))
                return _registered(cluster) == set(cluster.workers) and seen[-1] == (1, 1)
            _wait_for(back_in_both_views, TTL_S + 5.0, "every worker re-registered and in the router's view")
        # The router's first read of the empty Redis must not drop a worker that has not beaten yet
        # (it keeps its last snapshot's workers for its recovery window: 3 s, three heartbeats).
        assert set(seen) == {(1, 1)}, f"the router's view while the workers re-registered: {sorted(set(seen))}"
        served_at_return = traffic.ok
        _wait_for(lambda: traffic.ok >= served_at_return + 3, 60, "traffic served after Redis returned")
    assert traffic.failed == []


def test_a_killed_router_ends_streams_cleanly_frees_their_kv_and_a_restarted_one_serves_retried_calls(cluster):
    streaming = threading.Semaphore(0)

    def long_stream(client: Client) -> list:
        received = []
        with pytest.raises(NoHealthyWorker):   # UNAVAILABLE from the transport, typed
            for chunk in client.generate("a long answer", max_tokens=2000, temperature=0, ignore_eos=True):
                received.append(chunk)
                if len(received) == 1:
                    streaming.release()
        return received

    with Client(cluster.grpc_target, retries=0) as client, ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(long_stream, client) for _ in range(2)]
        assert all(streaming.acquire(timeout=60) for _ in streams)   # both are streaming
        killed_at = time.monotonic()
        cluster.kill_router()
        for stream in streams:
            assert len(stream.result(timeout=10)) > 0          # it was streaming, then ended
        assert time.monotonic() - killed_at < 5.0              # promptly, no hang
    loads = wait_until_idle(cluster, timeout_s=LEASE_S + 10)    # no lease outlives its expiry
    assert all(load.kv_blocks_used == 0 and load.num_running == 0 for load in loads.values())

    # the call is retried until the router is back; its budget covers a router start on a slow host
    # (the SDK's default of 15 s is short of one there)
    with Client(cluster.grpc_target, retry_budget_s=120) as client, ThreadPoolExecutor(1) as pool:
        retried = pool.submit(lambda: list(client.generate("are you back?", max_tokens=4, temperature=0,
                                                             ignore_eos=True)))
        cluster.start_router()                       # the call above was made while the router was down
        chunks = retried.result(timeout=60)
    assert sum(len(c.token_ids) for c in chunks) == 4 and chunks[-1].finish_reason == "length"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def test_a_restarting_router_holds_calls_that_reach_it_before_it_serves(cluster):
    cluster.kill_router()
    port = int(cluster.grpc_target.rsplit(":", 1)[1])
    _wait_for(lambda: not _accepts(port), 10, "the dead router's port to close")
    restart = threading.Thread(target=cluster.start_router, daemon=True)   # returns once it serves and routes
    restart.start()
    _wait_for(lambda: _accepts(port), 120, "the restarting router to bind its gRPC port")
    with grpc.insecure_channel(cluster.grpc_target) as channel:   # health needs no key (K8s probes)
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
    with Client(cluster.grpc_target, retries=0) as client:   # a refused connection would fail the call
        chunks = list(client.generate("held while the router starts", max_tokens=3, temperature=0,
                                      ignore_eos=True, timeout_s=180))
    restart.join(timeout=180)
    # the port was bound while the router could not serve yet (it says so), and the call made then
    # was held and served
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert sum(len(c.token_ids) for c in chunks) == 3 and chunks[-1].finish_reason == "length"
