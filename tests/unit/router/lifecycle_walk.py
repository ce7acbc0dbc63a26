"""What the router's lifecycle walks share in these tests (test_placement_walk.py,
test_admission_walk.py): prompts whose prefill cost `DEFAULT_COST` knows, scripted workers, and
serving one request through the lifecycle as its API edges do."""

from __future__ import annotations

import asyncio

from kv_transfer.handle import KVHandle
from pdserve.sampling import Sampling
from pdserve.worker_api import DecodeChunk, PrefillRequest, PrefillResult
from router.lifecycle import RouterConfig
from router.scheduler import SchedulerConfig
from router.types import GenerationRequest
from scripted_workers import ScriptedWorker

LONG = [100 + i % 1000 for i in range(2000)]   # DEFAULT_COST: ~1 s of prefill
SHORT = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
GREEDY = Sampling(max_tokens=2, temperature=0.0, ignore_eos=True)


class HeldPrefillWorker(ScriptedWorker):
    """A prefill worker whose first prefill waits for `unblock` (a long prompt being computed);
    every prefill it receives is recorded in order."""

    def __init__(self, first_token_id: int = 5, hold_all: bool = False):
        super().__init__(prefill=PrefillResult(first_token_id, False, kv_handle=KVHandle("t", "h:1", "p", (1,), 3)))
        self.unblock = asyncio.Event()
        self.hold_all = hold_all   # every prefill waits, not only the first

    async def prefill(self, request: PrefillRequest, timeout_s: float) -> PrefillResult:
        self.prefills.append(request)
        if len(self.prefills) == 1 or self.hold_all:
            await self.unblock.wait()
        return self.prefill_script


def decoder(tokens=(6,)) -> ScriptedWorker:
    return ScriptedWorker(decode=[DecodeChunk(tuple(tokens), finished=True, finish_reason="length")] * 8)


def router_config(**scheduler) -> RouterConfig:
    return RouterConfig(max_model_len=4096, scheduler=SchedulerConfig(**scheduler))


async def served(lifecycle, request_id: str, prompt: list[int], slo_class: str = "") -> list[int]:
    request = GenerationRequest(request_id, prompt, GREEDY, slo_class)
    lifecycle.admit(request)
    return [t async for chunk in lifecycle.generate(request) for t in chunk.token_ids]


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for the router"
        await asyncio.sleep(0.01)
