"""The decode role's server entry: the shared worker runtime around `DecodeHandler`."""

from __future__ import annotations

from decode_worker.handler import DecodeHandler
from pdserve.worker.config import WorkerConfig
from pdserve.worker.main import run_worker


async def serve(config: WorkerConfig, ready_file: str | None = None, metrics_port: int = 0) -> int:
    """Runs a decode worker until SIGTERM/SIGINT; then it drains, finishing the streams in flight
    (up to `config.drain_timeout_s`). Returns the exit code: non-zero if its engine died."""
    if config.role != "decode":
        raise ValueError(f"decode_worker.main serves the decode role, the config says {config.role!r}")
    return await run_worker(config, DecodeHandler, ready_file=ready_file, metrics_port=metrics_port)
