"""Timing the serving path: prefill and decode measured through a real 1P+1D local cluster.

The engine probe times vLLM alone. A request served by pdserve also pays the router (validation,
routing, detokenizing the stream), two gRPC hops per token and the workers' handlers; on a small
model on a few CPU cores those per-token costs are as large as the engine step itself. This
probe measures what a client sees, so the fitted model includes them:

- prefill: one request alone, `max_tokens=1`: send -> its only chunk (TTFT through the router:
  the prefill worker's RPC round trip);
- decode: `batch_size` streams started together (`ignore_eos`), the step time from the chunks'
  arrival times at the client, exactly as `engine_probe.steady_decode` reads an engine's outputs.

The cluster runs prefill and decode on separate core sets (one device each), as `pdserve up`
does; its KV transport is the first one profiled.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from pdserve.client import AsyncClient
from pdserve.engine import EngineSettings
from planner.profiler.engine_probe import DecodeMeasurement, Marks, steady_decode


@contextmanager
def local_cluster(engine: EngineSettings, transport: str, prefill_cores: str, decode_cores: str) -> Iterator[str]:
    """A 1P+1D `LocalCluster` for the probe; yields its gRPC target once the router sees both workers."""
    from pdserve.client import Client
    from pdserve.launcher import ClusterSpec, LocalCluster

    spec = ClusterSpec(engine=engine, transport=transport, cpu_cores={"prefill": prefill_cores, "decode": decode_cores})
    with LocalCluster(spec) as cluster, Client(cluster.grpc_target) as client:
        deadline = time.monotonic() + 60
        while not (info := client.model_info()).num_prefill_workers or not info.num_decode_workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the profiling cluster's router never saw its workers; logs in {cluster.log_dir}")
            time.sleep(0.1)
        yield cluster.grpc_target


class ClusterProbe:
    """Sends timed requests through a router. Token ids are drawn from [10, vocab_size)."""

    def __init__(self, client: AsyncClient, vocab_size: int, seed: int = 0) -> None:
        self.client = client
        self._rng = np.random.default_rng(seed)
        self._high = max(11, vocab_size)

    async def _run(self, prompt_tokens: int, max_tokens: int) -> Marks:
        ids = [int(i) for i in self._rng.integers(10, self._high, size=prompt_tokens)]
        marks, produced, started = [], 0, time.perf_counter()
        async for chunk in self.client.generate(token_ids=ids, max_tokens=max_tokens, ignore_eos=True,
                                                temperature=0.0):
            produced += len(chunk.token_ids)
            marks.append((time.perf_counter(), produced))
        return [(started, 0), *marks]

    async def prefill_s(self, prompt_tokens: int, repeats: int) -> float:
        """Median TTFT of a lone `prompt_tokens` prompt."""
        samples = []
        for _ in range(repeats):
            marks = await self._run(prompt_tokens, 1)
            samples.append(marks[1][0] - marks[0][0])
        return statistics.median(samples)

    async def decode(self, batch_size: int, context_per_seq: int, steps: int) -> DecodeMeasurement:
        """As the engine probe, over twice the steps: per-token streaming makes bursts likelier."""
        runs = await asyncio.gather(*(self._run(context_per_seq, 2 * steps + 1) for _ in range(batch_size)))
        return steady_decode([marks[1:] for marks in runs], batch_size, context_per_seq, 2 * steps)

    async def warm_up(self, prompt_tokens: int = 64, max_tokens: int = 8) -> None:
        await asyncio.gather(*(self._run(prompt_tokens, max_tokens) for _ in range(4)))
