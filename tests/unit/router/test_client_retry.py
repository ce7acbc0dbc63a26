"""The SDK retries a Generate only when the router never answered and nothing was received, for a
time budget that covers a router restart, never past the caller's own timeout: the rules with plain
values, then against real gRPC servers on real sockets (a router that is not up yet, one that
answers UNAVAILABLE itself, one that breaks a stream after its first chunk, none at all)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from pdserve.client import AsyncClient, Client, DeadlineExceeded, NoHealthyWorker, may_retry, retry_delay_s
from pdserve.errors import ANSWERED_METADATA, ServeError, grpc_code, grpc_trailing_metadata
from pdserve.retry import RetryPolicy, attempt_timeout_s, next_retry_delay_s
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_only_a_call_the_router_never_answered_and_that_sent_nothing_is_retried():
    assert may_retry(UNAVAILABLE, frozenset(), chunks_received=0)
    assert not may_retry(UNAVAILABLE, frozenset({ANSWERED_METADATA}), 0)    # the router said so itself
    assert not may_retry(UNAVAILABLE, frozenset(), chunks_received=1)      # output reached the caller
    assert not may_retry(grpc.StatusCode.INTERNAL, frozenset(), 0)
    assert not may_retry(grpc.StatusCode.DEADLINE_EXCEEDED, frozenset(), 0)


def test_the_backoff_doubles_from_a_quarter_second_up_to_two_with_a_fifth_either_way_of_jitter():
    assert [retry_delay_s(a) for a in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]   # jitter 0.5: nominal
    assert [retry_delay_s(a, jitter=0.0) for a in (0, 3)] == [0.2, 1.6]
    assert retry_delay_s(3, jitter=0.999) == pytest.approx(2.3992)
    assert retry_delay_s(10_000) == 2.0                                            # no overflow


def _schedule(policy: RetryPolicy, timeout_s: float | None = None, attempt_s: float = 0.0) -> list[float]:
    """The waits of a call whose every attempt fails after `attempt_s`, nominal jitter."""
    waits, elapsed_s = [], attempt_s
    while (delay_s := next_retry_delay_s(policy, len(waits), elapsed_s, timeout_s, jitter=0.5)) is not None:
        waits.append(delay_s)
        elapsed_s += delay_s + attempt_s
    return waits


def test_the_default_budget_keeps_retrying_for_thirty_seconds_longer_than_a_router_restart():
    waits = _schedule(RetryPolicy())
    assert waits == [0.25, 0.5, 1.0] + [2.0] * 14 + [0.25]   # the last one lands at 30 s
    assert sum(waits) == 30.0


def test_a_count_limit_a_zero_budget_and_time_spent_in_attempts_all_end_retries_sooner():
    assert _schedule(RetryPolicy(max_retries=3)) == [0.25, 0.5, 1.0]
    assert _schedule(RetryPolicy(max_retries=0)) == _schedule(RetryPolicy(budget_s=0.0)) == []
    # 1 s attempts: after 1+.25+1+.5+1 = 3.75 s, the third retry is pulled in to begin at the 4 s budget
    assert _schedule(RetryPolicy(budget_s=4.0), attempt_s=1.0) == [0.25, 0.5, 0.25]


def test_the_callers_timeout_bounds_the_whole_call_retries_included():
    assert _schedule(RetryPolicy(), timeout_s=2.0) == [0.25, 0.5, 1.0]   # a fourth would start at 3.75 s
    assert next_retry_delay_s(RetryPolicy(), 0, elapsed_s=1.9, timeout_s=2.0, jitter=0.5) is None
    assert attempt_timeout_s(timeout_s=10.0, elapsed_s=3.5) == 6.5     # each attempt gets what is left
    assert attempt_timeout_s(timeout_s=None, elapsed_s=3.5) is None
    assert attempt_timeout_s(timeout_s=1.0, elapsed_s=3.5) == 0.0


def test_a_policy_that_cannot_work_is_refused_with_the_fix():
    for bad in (dict(budget_s=-1.0), dict(max_retries=-1), dict(base_delay_s=3.0, max_delay_s=2.0)):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_every_router_error_carries_its_type_so_clients_can_tell_it_from_the_transport():
    assert dict(grpc_trailing_metadata(NoHealthyWorker("none")))[ANSWERED_METADATA] == "NoHealthyWorker"


class _Router(generation_pb2_grpc.GenerationServicer):
    """Scripted: `mode` "ok" streams two chunks, "no-worker" answers as the router does when no
    worker is alive, "break" sends one chunk and then fails as a dying connection would."""

    def __init__(self, mode: str):
        self.mode, self.calls = mode, 0

    def Generate(self, request, context):
        self.calls += 1
        if self.mode == "no-worker":
            error = NoHealthyWorker("no decode worker is alive")
            context.set_trailing_metadata(grpc_trailing_metadata(error))
            context.abort(grpc_code(error), error.message)
        yield pb.GenerateResponse(request_id="r", token_ids=[1], text="a")
        if self.mode == "break":
            context.abort(UNAVAILABLE, "connection reset")
        yield pb.GenerateResponse(request_id="r", token_ids=[2], text="b", finished=True, finish_reason="length")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(router: _Router, port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    generation_pb2_grpc.add_GenerationServicer_to_server(router, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def test_a_router_that_comes_up_during_the_backoff_serves_the_call():
    port, router = _free_port(), _Router("ok")
    starter = threading.Timer(0.5, lambda: servers.append(_serve(router, port)))
    servers: list[grpc.Server] = []
    starter.start()
    try:
        with Client(f"127.0.0.1:{port}") as client:   # the default budget, no count limit
            chunks = list(client.generate("hi", max_tokens=2))
        assert [c.token_ids for c in chunks] == [[1], [2]] and router.calls == 1
    finally:
        starter.join()
        for server in servers:
            server.stop(0)


def test_the_router_s_own_unavailable_and_a_stream_broken_after_output_are_raised_at_once():
    for mode in ("no-worker", "break"):
        port, router = _free_port(), _Router(mode)
        server = _serve(router, port)
        try:
            with Client(f"127.0.0.1:{port}", retries=5) as client:
                started = time.monotonic()
                received = []
                with pytest.raises(ServeError):
                    for chunk in client.generate("hi", max_tokens=2):
                        received.append(chunk)
                assert time.monotonic() - started < 1.0 and router.calls == 1, mode   # no backoff, no second call
                assert len(received) == (1 if mode == "break" else 0)
        finally:
            server.stop(0)


def test_with_no_router_at_all_the_call_fails_after_its_retries():
    with Client(f"127.0.0.1:{_free_port()}", retries=2) as client:
        started = time.monotonic()
        with pytest.raises(ServeError):
            list(client.generate("hi", max_tokens=2))
        waited_s = time.monotonic() - started
        assert retry_delay_s(0, jitter=0.0) + retry_delay_s(1, jitter=0.0) <= waited_s < 1.5   # two jittered waits


def test_with_no_router_at_all_the_call_fails_when_its_budget_is_spent():
    with Client(f"127.0.0.1:{_free_port()}", retry_budget_s=1.5) as client:
        started = time.monotonic()
        with pytest.raises(NoHealthyWorker):
            list(client.generate("hi", max_tokens=2))
        assert 1.5 <= time.monotonic() - started < 2.5   # the last retry began at the budget's end


def test_with_no_router_at_all_the_callers_timeout_ends_the_retries():
    with Client(f"127.0.0.1:{_free_port()}") as client:   # a 30 s budget, a 1 s timeout
        started = time.monotonic()
        with pytest.raises((NoHealthyWorker, DeadlineExceeded)):
            list(client.generate("hi", max_tokens=2, timeout_s=1.0))
        assert time.monotonic() - started < 1.5   # not the 30 s budget


def test_the_async_client_retries_on_the_same_budget_and_serves_once_the_router_is_up():
    port, router = _free_port(), _Router("ok")
    servers: list[grpc.Server] = []
    starter = threading.Timer(0.5, lambda: servers.append(_serve(router, port)))

    async def run() -> list:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            return [chunk async for chunk in client.generate("hi", max_tokens=2)]

    starter.start()
    try:
        chunks = asyncio.run(run())
        assert [c.token_ids for c in chunks] == [[1], [2]] and router.calls == 1
    finally:
        starter.join()
        for server in servers:
            server.stop(0)
