"""Scripted workers behind the router's `WorkerClient` boundary, and a lifecycle over them.

Test doubles of the RPC boundary only (the registry is a real Redis, the tokenizer the tiny
model's): the router's decisions are driven with exact tokens; real clusters are in tests/integration.
"""

from __future__ import annotations

import uuid

from pdserve.registry import Registry, WorkerRecord
from pdserve.worker_api import DecodeChunk, DecodeRequest, PrefillRequest, PrefillResult
from router.lifecycle import Lifecycle, RouterConfig
from router.pool import WorkerPool
from router.worker_client import WorkerError


class ScriptedWorker:
    """A `WorkerClient` that answers from a script: a prefill result or a WorkerError, and a
    decode stream of chunks that may end with a WorkerError. Records every call it receives."""

    def __init__(self, prefill: PrefillResult | WorkerError | None = None,
                 decode: list[DecodeChunk | WorkerError] = ()):
        self.prefill_script, self.decode_script = prefill, list(decode)
        self.prefills: list[PrefillRequest] = []
        self.decodes: list[DecodeRequest] = []
        self.releases: list[tuple[str, str]] = []
        self.num_streams_closed = 0

    async def prefill(self, request: PrefillRequest, timeout_s: float) -> PrefillResult:
        self.prefills.append(request)
        if isinstance(self.prefill_script, WorkerError):
            raise self.prefill_script
        return self.prefill_script

    async def decode(self, request: DecodeRequest, timeout_s: float):
        self.decodes.append(request)
        try:
            for step in self.decode_script:
                if isinstance(step, WorkerError):
                    raise step
                yield step
        finally:
            self.num_streams_closed += 1

    async def release(self, transfer_id: str, request_id: str) -> bool:
        self.releases.append((transfer_id, request_id))
        return True

    async def close(self) -> None:
        pass


async def scripted_cluster(redis_server, tokenizer, workers: dict[str, ScriptedWorker],
                           config: RouterConfig | None = None, records: dict[str, dict] | None = None):
    """A lifecycle whose pool sees `workers` (id -> script; the role is the id's prefix);
    `records` adds registry fields per worker id (block_size, kv_blocks_total, ...)."""
    registry = Registry(redis_server.url, f"walk-{uuid.uuid4().hex[:8]}")
    for worker_id in workers:
        extra = (records or {}).get(worker_id, {})
        await registry.heartbeat(WorkerRecord(worker_id, worker_id.split("-")[0], "tiny", f"{worker_id}:1", **extra),
                                 ttl_s=60)
    pool = WorkerPool(registry, connect=lambda address: workers[address.removesuffix(":1")])
    await pool.refresh()
    return Lifecycle(config or RouterConfig(max_model_len=256), pool, tokenizer), pool, registry


def sse_events(reply) -> list[dict]:
    """A streamed HTTP answer's events (each `data:` line's JSON), checked to end with [DONE]."""
    import json

    data = [line[len("data: "):] for line in reply.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]
