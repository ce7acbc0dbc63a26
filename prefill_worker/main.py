"""The prefill role's server entry: the shared worker runtime around `PrefillHandler`."""

from __future__ import annotations

from pdserve.worker.config import WorkerConfig
from pdserve.worker.main import run_worker
from prefill_worker.handler import PrefillHandler


async def serve(config: WorkerConfig, ready_file: str | None = None, metrics_port: int = 0) -> int:
    """Runs a prefill worker until SIGTERM/SIGINT; then it drains, waiting for the KV it holds
    under leases to be pulled (up to `config.drain_timeout_s`). Returns the exit code: non-zero if its
    engine died."""
    if config.role != "prefill":
        raise ValueError(f"prefill_worker.main serves the prefill role, the config says {config.role!r}")
    return await run_worker(config, PrefillHandler, ready_file=ready_file, metrics_port=metrics_port)
