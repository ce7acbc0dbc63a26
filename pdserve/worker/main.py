"""Runs one worker process until SIGTERM/SIGINT, then drains. See `pdserve.worker.server`.

The runtime is role-blind: a role's entry (`prefill_worker.main`, `decode_worker.main`) calls
`run_worker` with the factory of its handler (`pdserve.worker.handler`)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from kv_transfer.auth import Credentials, load_secret, set_process_credentials
from kv_transfer.config import ConnectorConfig
from pdserve.cpu_placement import bind_this_process
from pdserve.engine import start_engine
from pdserve.metrics import start_metrics_server
from pdserve.registry import Registry
from pdserve.rpc_auth_grpc import server_interceptors
from pdserve.rpc_keepalive import server_options
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.config import WorkerConfig, free_port
from pdserve.worker.drain import drain
from pdserve.worker.handler import HandlerFactory
from pdserve.worker.heartbeat import heartbeat_loop
from pdserve.worker.load import EngineLoad, engine_stat_loggers
from pdserve.worker.server import WorkerRuntime, WorkerServicer
from pdserve.worker.watchdog import EngineWatchdog, judge, leave

logger = logging.getLogger("pdserve.worker")


def _start_engine(config: WorkerConfig, load: EngineLoad) -> tuple[object, str]:
    kv_port = config.kv_port or free_port(config.bind_host)
    connector = ConnectorConfig(transport=config.transport, host=config.advertise_host, bind_host=config.bind_host,
                                port=kv_port, model=_model_name(config), lease_s=config.lease_s,
                                pull_timeout_s=config.kv_pull_timeout_s,
                                grant_token=secrets.token_hex(16),  # the engine's early lease grants (kv_transfer.grants)
                                cluster_secret_file=config.cluster_secret_file, worker_id=config.worker_id,
                                kv_encryption=config.kv_encryption)
    # This process has computed nothing (no OpenMP region): vLLM's engine core may be forked from it
    # where it started under the engine's environment (`pdserve worker` re-executes itself for that).
    engine = start_engine(config.engine, config.role, connector, engine_id=config.worker_id,
                          stat_loggers=engine_stat_loggers(load), fork_safe=True)
    return engine, f"{config.advertise_host}:{kv_port}"


def _model_name(config: WorkerConfig) -> str:
    import os

    return os.path.basename(os.path.normpath(config.engine.model))


async def run_worker(config: WorkerConfig, make_handler: HandlerFactory, ready_file: str | None = None,
                     metrics_port: int = 0) -> int:
    """Serves until SIGTERM/SIGINT, then drains and stops the engine: returns 0. If the engine dies
    first, leaves at once (`pdserve.worker.watchdog`) and returns its non-zero exit code.
    `make_handler(runtime)` is called once the engine runs; `ready_file` gets the gRPC address once serving."""
    bind_this_process(config.engine.cpu_cores)  # before vLLM spawns its engine core and model runner
    # The cluster secret guards both planes: this process's KV releases (the router's aborts)
    # authenticate as the worker, and its gRPC serves only callers proving it. A bad file fails here.
    secret = load_secret(config.cluster_secret_file) if config.cluster_secret_file else None
    set_process_credentials(Credentials(config.worker_id, secret, config.kv_encryption))
    load = EngineLoad()
    engine, kv_address = _start_engine(config, load)
    if metrics_port:   # after the engine core starts: a fork must not inherit the listening socket and its thread
        start_metrics_server(config.bind_host, metrics_port)
    runtime = WorkerRuntime(config, engine, load, kv_address=kv_address)
    watchdog = EngineWatchdog(engine)
    server, health, port = create_server(config, WorkerServicer(runtime, make_handler(runtime), watchdog), secret)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    grpc_address = f"{config.advertise_host}:{port}"
    registry = Registry(config.redis_url, config.cluster)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    heartbeat = asyncio.create_task(heartbeat_loop(registry, runtime, grpc_address, stop))
    logger.info("%s worker %s serving on %s (kv %s)", config.role, config.worker_id, grpc_address, kv_address)
    if ready_file:
        with open(ready_file, "w") as ready:
            ready.write(grpc_address)
    exit_code = await _serve_until_stopped_or_dead(stop, watchdog, runtime, registry, health, heartbeat)
    await server.stop(grace=1.0)
    engine.shutdown()
    await registry.close()
    return exit_code


def create_server(config: WorkerConfig, servicer: worker_pb2_grpc.WorkerServicer,
                  secret: bytes | None) -> tuple[grpc.aio.Server, HealthServicer, int]:
    """The worker's gRPC server, bound (not started), with grpc.health.v1, and its port. With a
    `secret`, `Worker` calls need proof of it (`pdserve.rpc_auth`) made for the address the worker
    advertises; health checks do not."""
    interceptors = server_interceptors(secret)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *server_options()], interceptors=interceptors)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port(f"{config.bind_host}:{config.grpc_port}")
    for interceptor in interceptors:
        interceptor.audiences = frozenset({f"{config.advertise_host}:{port}"})
    return server, health, port


async def _serve_until_stopped_or_dead(stop: asyncio.Event, watchdog: EngineWatchdog, runtime: WorkerRuntime,
                                       registry: Registry, health, heartbeat: asyncio.Task) -> int:
    """SIGTERM/SIGINT: the drain, 0. The engine's death: leave at once, its exit code."""
    stopped, dead = asyncio.create_task(stop.wait()), asyncio.create_task(watchdog.wait_dead())
    await asyncio.wait({stopped, dead}, return_when=asyncio.FIRST_COMPLETED)
    if not dead.done():
        dead.cancel()
        await drain(runtime, registry, health, heartbeat)
        return judge(watchdog.observe()).exit_code or 0  # an engine that died while draining is still dead
    stopped.cancel()
    return await leave(dead.result(), health=health, heartbeat_stop=stop, heartbeat=heartbeat, registry=registry,
                       worker_id=runtime.config.worker_id)
