"""Runs one worker process until SIGTERM/SIGINT, then drains. See `pdserve.worker.server`."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from kv_transfer.config import ConnectorConfig
from pdserve.engine import engine_args
from pdserve.metrics import WORKER_GAUGES
from pdserve.registry import Registry, WorkerRecord
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.config import WorkerConfig, free_port
from pdserve.worker.load import EngineLoad, stat_logger_factory
from pdserve.worker.server import WorkerRuntime, WorkerServicer

logger = logging.getLogger("pdserve.worker")


def _handler_for(runtime: WorkerRuntime):
    if runtime.config.role == "prefill":
        from prefill_worker.handler import PrefillHandler

        return PrefillHandler(runtime)
    from decode_worker.handler import DecodeHandler

    return DecodeHandler(runtime)


def _start_engine(config: WorkerConfig, load: EngineLoad) -> tuple[object, str]:
    from vllm.v1.engine.async_llm import AsyncLLM

    kv_port = config.kv_port or free_port(config.bind_host)
    connector = ConnectorConfig(transport=config.transport, host=config.advertise_host, bind_host=config.bind_host,
                                port=kv_port, model=_model_name(config), lease_s=config.lease_s)
    args = engine_args(config.engine, config.role, connector, engine_id=config.worker_id)
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(load)])
    return engine, f"{config.advertise_host}:{kv_port}"


def _model_name(config: WorkerConfig) -> str:
    import os

    return os.path.basename(os.path.normpath(config.engine.model))


def _record(runtime: WorkerRuntime, grpc_address: str, draining: bool) -> WorkerRecord:
    load, config = runtime.load, runtime.config
    return WorkerRecord(
        worker_id=config.worker_id, role=config.role, model=runtime.model_name, grpc_address=grpc_address,
        kv_address=runtime.kv_address if config.role == "prefill" else "", engine_id=config.worker_id,
        max_model_len=config.engine.max_model_len, block_size=config.engine.block_size,
        num_running=load.num_running, num_waiting=load.num_waiting, num_inflight=len(runtime.inflight),
        kv_blocks_used=load.kv_blocks_used, kv_blocks_total=load.kv_blocks_total,
        pending_transfers=load.pending_transfers, draining=int(draining),
    )


async def _heartbeat(registry: Registry, runtime: WorkerRuntime, grpc_address: str, stop: asyncio.Event) -> None:
    config = runtime.config
    while not stop.is_set():
        record = _record(runtime, grpc_address, draining=False)
        for name, gauge in WORKER_GAUGES.items():
            gauge.set(getattr(record, name))
        try:
            await registry.heartbeat(record, config.ttl_s)
        except OSError as error:  # redis down: keep serving, the lease lapses and routers stop sending
            logger.warning("registry heartbeat failed: %s", error)
        try:
            await asyncio.wait_for(stop.wait(), config.heartbeat_s)
        except asyncio.TimeoutError:
            pass


async def run_worker(config: WorkerConfig, ready_file: str | None = None, metrics_port: int = 0) -> None:
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=config.bind_host)
    load = EngineLoad()
    engine, kv_address = _start_engine(config, load)
    runtime = WorkerRuntime(config, engine, load, kv_address=kv_address)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(runtime, _handler_for(runtime)), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port(f"{config.bind_host}:{config.grpc_port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    grpc_address = f"{config.advertise_host}:{port}"
    registry = Registry(config.redis_url, config.cluster)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    heartbeat = asyncio.create_task(_heartbeat(registry, runtime, grpc_address, stop))
    logger.info("%s worker %s serving on %s (kv %s)", config.role, config.worker_id, grpc_address, kv_address)
    if ready_file:
        with open(ready_file, "w") as ready:
            ready.write(grpc_address)
    await stop.wait()
    await _drain(config, runtime, registry, health, heartbeat)
    await server.stop(grace=1.0)
    engine.shutdown()
    await registry.close()


async def _drain(config, runtime, registry, health, heartbeat) -> None:
    """Stops new work from arriving, then waits for in-flight requests to finish."""
    await health.enter_graceful_shutdown()
    await heartbeat
    await registry.deregister(config.worker_id)
    deadline = time.monotonic() + config.drain_timeout_s
    while runtime.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if runtime.inflight:
        logger.warning("drain timed out with %d requests in flight", len(runtime.inflight))
