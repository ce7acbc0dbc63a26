"""Worker gRPC authenticated by the cluster secret, over real sockets: the worker's own server
(`pdserve.worker.main.create_server`, its real servicer) around a scripted role handler, called by
the router's real client (`GrpcWorkerClient`) and by raw stubs. No engine: what is checked is that
a refused call never reaches the handler or the engine."""

from __future__ import annotations

import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.engine import EngineSettings
from pdserve.rpc_auth import HEADER, make_token
from pdserve.rpc_auth_grpc import client_interceptors, worker_channel
from pdserve.sampling import Sampling
from pdserve.v1 import worker_pb2, worker_pb2_grpc
from pdserve.worker.config import WorkerConfig
from pdserve.worker.load import EngineLoad
from pdserve.worker.main import create_server
from pdserve.worker.server import WorkerRuntime, WorkerServicer
from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillRequest, PrefillResult
from router.grpc_worker_client import GrpcWorkerClient
from router.worker_client import WorkerError

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_SECRET = b"fedcba9876543210fedcba9876543210"
PREFILL = worker_pb2.PrefillRequest(request_id="r-1", prompt_token_ids=[5, 6, 7], transfer_id="t-1")


class ScriptedHandler:
    """Serves both phases from a script and records every call it gets."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        self.calls.append(("prefill", request.request_id))
        return PrefillResult(first_token_id=42, finished=True, finish_reason="length")

    async def decode(self, request: DecodeRequest):
        self.calls.append(("decode", request.request_id))
        yield DecodeChunk(token_ids=(8, 9))
        yield DecodeChunk(token_ids=(10,), finished=True, finish_reason="length")

    async def release(self, transfer_id: str) -> bool:
        self.calls.append(("release", transfer_id))
        return True


class RecordingEngine:
    def __init__(self):
        self.aborted: list[str] = []

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


@pytest.fixture(scope="module", autouse=True)
def vllm_imported():
    """The servicer's first request imports vLLM (its sampling checks), seconds on a busy host: done
    here, outside any call's deadline."""
    from pdserve.worker_proto import prefill_request_from_proto

    prefill_request_from_proto(PREFILL)


@pytest.fixture
async def worker(request):
    """(address, handler, engine) of a worker serving with the secret `request.param` (default SECRET)."""
    secret = getattr(request, "param", SECRET)
    config = WorkerConfig(role="decode", engine=EngineSettings(model="/models/tiny"), redis_url="redis://h:1/0")
    handler, engine = ScriptedHandler(), RecordingEngine()
    servicer = WorkerServicer(WorkerRuntime(config, engine, EngineLoad()), handler)
    server, health, port = create_server(config, servicer, secret)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    yield f"127.0.0.1:{port}", handler, engine
    await server.stop(grace=None)


async def every_call(stub) -> list[grpc.StatusCode]:
    """The status of one call of each Worker method (OK when served)."""
    codes = []
    calls = (lambda: stub.Prefill(PREFILL, timeout=5), lambda: _drain(stub.Decode(worker_pb2.DecodeRequest(
        request_id="r-2", prompt_token_ids=[5]), timeout=5)),
             lambda: stub.Abort(worker_pb2.WorkerAbortRequest(request_id="r-3", transfer_id="t-3"), timeout=5),
             lambda: stub.GetLoad(worker_pb2.GetLoadRequest(), timeout=5))
    for call in calls:
        try:
            await call()
            codes.append(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as error:
            codes.append(error.code())
    return codes


async def _drain(stream):
    return [reply async for reply in stream]


@pytest.mark.parametrize("signer", [None, OTHER_SECRET, "proof for another worker"],
                         ids=["no proof", "another secret", "another worker's proof"])
async def test_calls_without_the_right_proof_are_refused_unauthenticated_before_the_handler_or_engine_run(
        worker, signer, caplog):
    address, handler, engine = worker
    interceptors = ([] if signer is None else client_interceptors(SECRET, "10.9.9.9:50061")
                    if isinstance(signer, str) else client_interceptors(signer, address))
    with caplog.at_level(logging.WARNING, logger="pdserve.rpc_auth_grpc"):
        async with grpc.aio.insecure_channel(address, interceptors=interceptors) as channel:
            codes = await every_call(worker_pb2_grpc.WorkerStub(channel))

    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 4
    assert handler.calls == [] and engine.aborted == []
    assert "no proof" in caplog.text if signer is None else "does not match" in caplog.text
    assert "refused 1 unauthenticated worker call(s), the latest to /pdserve.v1.Worker/Prefill" in caplog.text


async def test_the_routers_client_with_the_cluster_secret_is_served(worker):
    address, handler, engine = worker
    client = GrpcWorkerClient(address, secret=SECRET)
    try:
        result = await client.prefill(PrefillRequest("r-1", (5, 6, 7), Sampling(max_tokens=4), "t-1"), timeout_s=5)
        chunks = [chunk async for chunk in client.decode(DecodeRequest("r-2", (5,), Sampling(max_tokens=3)), 5)]
        found = await client.release("t-3", "r-3")
    finally:
        await client.close()

    assert (result.first_token_id, result.finished) == (42, True)
    assert [c.token_ids for c in chunks] == [(8, 9), (10,)] and chunks[-1].finished
    assert found is True
    assert handler.calls == [("prefill", "r-1"), ("decode", "r-2"), ("release", "t-3")]
    assert engine.aborted == ["r-3"]


async def test_the_routers_client_without_the_secret_gets_unauthenticated_as_a_worker_error(worker):
    address, handler, _ = worker
    client = GrpcWorkerClient(address)
    try:
        with pytest.raises(WorkerError) as refused:
            await client.prefill(PrefillRequest("r-1", (5,), Sampling(max_tokens=4), "t-1"), timeout_s=5)
    finally:
        await client.close()
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "worker gRPC needs the cluster's credentials" in refused.value.details
    assert handler.calls == []


async def test_a_recorded_proof_is_served_once_and_refused_when_replayed(worker):
    address, handler, _ = worker
    import time

    proof = ((HEADER, make_token(SECRET, address, "/pdserve.v1.Worker/Prefill", time.time())),)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        first = await stub.Prefill(PREFILL, metadata=proof, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as replayed:
            await stub.Prefill(PREFILL, metadata=proof, timeout=5)

    assert first.first_token_id == 42
    assert replayed.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "replayed proof" in replayed.value.details()
    assert handler.calls == [("prefill", "r-1")]


async def test_health_checks_need_no_proof(worker):
    address, handler, _ = worker
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_synchronous_tool_channel_with_the_secret_is_served(worker):
    address, handler, _ = worker
    import asyncio

    def get_load():
        with worker_channel(address, SECRET) as channel:
            return worker_pb2_grpc.WorkerStub(channel).GetLoad(worker_pb2.GetLoadRequest(), timeout=5)

    load = await asyncio.to_thread(get_load)
    assert load.role == "decode"


@pytest.mark.parametrize("worker", [None], indirect=True, ids=["worker without a secret"])
async def test_a_worker_without_a_secret_serves_unsigned_and_signed_calls_as_before(worker):
    address, handler, _ = worker
    async with grpc.aio.insecure_channel(address) as channel:
        assert await every_call(worker_pb2_grpc.WorkerStub(channel)) == [grpc.StatusCode.OK] * 4
    client = GrpcWorkerClient(address, secret=SECRET)
    try:
        assert await client.release("t-4", "r-4") is True
    finally:
        await client.close()
    assert [call for call, _ in handler.calls] == ["prefill", "decode", "release", "release"]


def test_each_side_without_a_secret_warns_once(caplog):
    from pdserve import rpc_auth_grpc

    rpc_auth_grpc._warned.clear()
    with caplog.at_level(logging.WARNING, logger="pdserve.rpc_auth_grpc"):
        for _ in range(3):
            assert rpc_auth_grpc.server_interceptors(None) == []
            assert rpc_auth_grpc.client_interceptors(None, "127.0.0.1:1") == []
        assert len(rpc_auth_grpc.server_interceptors(SECRET)) == 1
        assert len(rpc_auth_grpc.client_interceptors(SECRET, "127.0.0.1:1")) == 2   # unary and streaming calls
    assert [r.message.split(" (")[0] for r in caplog.records] == ["worker gRPC is unauthenticated"] * 2
    assert "the worker has no cluster secret" in caplog.records[0].message
    assert "the router has no cluster secret" in caplog.records[1].message
