"""The router process: gRPC `Generation` + health, and the OpenAI HTTP API, in one event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass, field

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from kv_transfer.auth import load_secret
from pdserve import metrics
from pdserve.registry import Registry
from router.grpc_api import GenerationService, StartingGenerationService, add_generation_service
from router.grpc_worker_client import GrpcWorkerClient
from router.lifecycle import Lifecycle, RouterConfig
from router.openai_tools import ChatParsing
from router.live_stats import start_load_publisher
from router.public_auth import PublicApiConfig, grpc_interceptors, http_app, warn_if_exposed
from router.public_tls import add_port
from router.pool import WorkerPool
from router.tokenizer import RouterTokenizer

logger = logging.getLogger("pdserve.router")


@dataclass(frozen=True)
class RouterProcessConfig:
    model: str
    redis_url: str = field(repr=False)   # may hold the Redis password (the entry point puts it there)
    cluster: str = "default"
    host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_port: int = 8000
    router: RouterConfig = RouterConfig(max_model_len=2048)
    drain_timeout_s: float = 30.0   # SIGTERM -> streams in flight may run this long, then are cancelled
    cluster_secret_file: str = ""   # proves the router to the workers (pdserve.rpc_auth); "" = unsigned calls
    public: PublicApiConfig = PublicApiConfig()   # TLS and API keys of both public ports (router.public_auth)
    chat_parsing: ChatParsing = ChatParsing()     # tool-call and reasoning parsers of chat answers (none: vLLM's default)

    def __post_init__(self) -> None:
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0 seconds, got {self.drain_timeout_s}")
        problem = self.public.problem_at(self.host)
        if problem:
            raise ValueError(problem)


def _http_app_factory():
    """`router.http_api.create_app`, imported once the gRPC port is bound (it imports vLLM)."""
    from router.http_api import create_app

    return create_app


async def run_router(config: RouterProcessConfig, ready_file: str | None = None) -> None:
    """Serves until SIGTERM/SIGINT, then drains. The gRPC port is bound first and holds calls
    while the rest starts (`StartingGenerationService`; health says NOT_SERVING until then); the
    HTTP port and `ready_file` come once requests can be served."""
    model_name = os.path.basename(os.path.normpath(config.model))
    server = grpc.aio.server(interceptors=grpc_interceptors(config.public))
    starting = StartingGenerationService()
    add_generation_service(starting, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    grpc_port = add_port(server, f"{config.host}:{config.grpc_port}", config.public.tls)
    await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)   # before the port opens (its default: SERVING)
    await server.start()
    logger.info("router: gRPC %s:%d bound; calls wait there until the router serves", config.host, grpc_port)

    secret = load_secret(config.cluster_secret_file) if config.cluster_secret_file else None
    registry = Registry(config.redis_url, config.cluster)
    pool = WorkerPool(registry, connect=lambda address: GrpcWorkerClient(address, secret=secret))
    await pool.start()
    metrics.ROUTER_WORKER_LOAD.source = pool.load_rows
    # vLLM's validation, the tokenizer and the HTTP API (its bodies read vLLM's request models):
    # seconds to a minute on a loaded host, off the event loop so the held calls' connections are
    # kept alive meanwhile. Nothing that imports vLLM may be imported before the port is bound.
    lifecycle = await asyncio.to_thread(lambda: Lifecycle(config.router, pool, RouterTokenizer(config.model)))
    create_app = await asyncio.to_thread(_http_app_factory)
    load_publisher = start_load_publisher(config.redis_url, config.cluster, lambda: lifecycle.inflight)
    metrics.ROUTER_ADMISSION_CALIBRATION.source = lifecycle.scheduler.calibration_rows
    starting.serve(GenerationService(lifecycle, model_name))
    await health.set("", health_pb2.HealthCheckResponse.SERVING)

    http = uvicorn.Server(uvicorn.Config(http_app(create_app(lifecycle, model_name, config.model, config.chat_parsing), config.public), host=config.host,
                                         port=config.http_port, log_level="warning", access_log=False,
                                         timeout_graceful_shutdown=config.drain_timeout_s,
                                         **config.public.tls.uvicorn_options()))
    http.install_signal_handlers = lambda: None
    http_task = asyncio.create_task(http.serve())
    while not http.started and not http_task.done():
        await asyncio.sleep(0.02)
    http_port = http.servers[0].sockets[0].getsockname()[1] if http.started else config.http_port
    scheme = config.public.tls.http_scheme
    logger.info("router: gRPC %s:%d, HTTP %s:%d (%s, API keys: %d)", config.host, grpc_port, config.host, http_port,
                "TLS" if scheme == "https" else "plaintext", len(config.public.api_keys))
    warn_if_exposed(config.host, config.public)
    if ready_file:
        with open(ready_file, "w") as ready:
            ready.write(f"{config.host}:{grpc_port} {scheme}://{config.host}:{http_port}")

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    # Drain: refuse new calls, let streams in flight finish on both APIs (they drain side by side)
    # for up to drain_timeout_s, then cancel what is left.
    await health.enter_graceful_shutdown()
    http.should_exit = True
    await server.stop(grace=config.drain_timeout_s)
    await http_task
    load_publisher.cancel()
    await pool.close()
    await registry.close()
