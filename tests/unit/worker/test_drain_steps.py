"""What a worker waits for after SIGTERM before it stops its engine (`pdserve.worker.drain`).

Plain values for the decision; the wait loop runs against a WorkerRuntime whose in-flight table
and engine load change as a real worker's would (no engine: the load is what vLLM's stats write).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pdserve.engine import EngineSettings
from pdserve.worker.config import WorkerConfig
from pdserve.worker.drain import drained, wait_drained
from pdserve.worker.load import EngineLoad
from pdserve.worker.server import WorkerRuntime


@pytest.mark.parametrize("role, inflight, blocks, expected", [
    ("prefill", 0, 0, True),
    ("prefill", 1, 0, False),   # a prompt still running
    ("prefill", 0, 4, False),   # its KV still leased to a decode worker that has not pulled it
    ("decode", 0, 4, True),     # a decode worker's blocks are its own requests' (or cached)
    ("decode", 2, 0, False),
])
def test_drained_needs_no_request_in_flight_and_on_prefill_no_leased_block(role, inflight, blocks, expected):
    assert drained(role, inflight, blocks) is expected


def make_runtime(role: str, kv_blocks_used: int) -> WorkerRuntime:
    config = WorkerConfig(role=role, engine=EngineSettings(model="/models/tiny"), redis_url="redis://h:1/0")
    return WorkerRuntime(config, engine=None, load=EngineLoad(kv_blocks_used=kv_blocks_used, kv_blocks_total=64))


async def test_prefill_waits_for_its_request_and_then_for_the_kv_pull():
    runtime = make_runtime("prefill", kv_blocks_used=3)
    runtime.inflight["req-1"] = "transfer-1"

    async def worker_life() -> None:
        await asyncio.sleep(0.2)
        runtime.inflight.pop("req-1")        # the prefill returned; its blocks stay leased
        await asyncio.sleep(0.3)
        runtime.load.kv_blocks_used = 0      # the decode worker pulled them and released the lease

    started = time.monotonic()
    life = asyncio.create_task(worker_life())
    assert await wait_drained(runtime, started + 5, poll_s=0.01)
    assert time.monotonic() - started >= 0.5
    await life


async def test_decode_is_drained_when_its_last_stream_ends():
    runtime = make_runtime("decode", kv_blocks_used=5)
    runtime.inflight["req-1"] = ""
    asyncio.get_running_loop().call_later(0.1, runtime.inflight.pop, "req-1")
    started = time.monotonic()
    assert await wait_drained(runtime, started + 5, poll_s=0.01)
    assert 0.1 <= time.monotonic() - started < 1.0


async def test_the_deadline_ends_a_wait_for_kv_nobody_pulls():
    runtime = make_runtime("prefill", kv_blocks_used=2)
    started = time.monotonic()
    assert not await wait_drained(runtime, started + 0.2, poll_s=0.01)
    assert 0.2 <= time.monotonic() - started < 1.0
