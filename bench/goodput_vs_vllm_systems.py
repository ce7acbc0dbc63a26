"""The two systems `goodput_vs_vllm.py` compares, started and stopped on demand (never both up:
they share the machine's two cores).

- A `ColocatedVllm`: vLLM's own OpenAI server, one engine bound to both cores.
- B `PdserveDisaggregated`: a pdserve `LocalCluster`, 1 prefill worker on one core and 1 decode
  worker on the other, KV over tcp.
Both run the same `EngineSettings` (model, dtype, block size, context, batch limit, seed); A gets
the KV cache bytes of B's two workers together, so neither has more KV memory.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import httpx

from loadgen.targets.base import Target
from loadgen.targets.openai_http import OpenAICompletionsTarget
from loadgen.targets.pdserve_grpc import PdserveGrpcTarget
from loadgen.vllm_server import VllmOpenAIServer
from pdserve.client import Client
from pdserve.engine import EngineSettings
from pdserve.launcher import ClusterSpec, LocalCluster


class ColocatedVllm:
    key = "A"

    def __init__(self, settings: EngineSettings, cores: str, log_dir: Path) -> None:
        self.settings = replace(settings, cpu_cores=cores, kv_cache_bytes=2 * settings.kv_cache_bytes)
        self.label = f"A: vLLM colocated (cores {cores})"
        self.log_dir = log_dir
        self._server: VllmOpenAIServer | None = None

    def start(self) -> None:
        self._server = VllmOpenAIServer(self.settings, log_path=self.log_dir / "vllm_server.log").start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def healthy(self) -> bool:
        if self._server is None:
            return False
        try:
            return httpx.get(f"{self._server.url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def target(self) -> Target:
        return OpenAICompletionsTarget(self._server.url)  # model: the one the server lists


class PdserveDisaggregated:
    key = "B"

    def __init__(self, settings: EngineSettings, prefill_cores: str, decode_cores: str, log_dir: Path) -> None:
        self.spec = ClusterSpec(engine=settings, num_prefill=1, num_decode=1, transport="tcp",
                                cpu_cores={"prefill": prefill_cores, "decode": decode_cores},
                                log_dir=str(log_dir / "pdserve"))
        self.label = f"B: pdserve 1 prefill (core {prefill_cores}) + 1 decode (core {decode_cores})"
        self._cluster: LocalCluster | None = None

    def start(self) -> None:
        self._cluster = LocalCluster(self.spec).start()
        try:
            self._wait_for_both_workers()
        except BaseException:
            self.stop()
            raise

    def _wait_for_both_workers(self, timeout_s: float = 60.0) -> None:
        """The router refreshes its registry view in the background: wait until it routes to both."""
        deadline = time.monotonic() + timeout_s
        with Client(self._cluster.grpc_target) as client:
            while time.monotonic() < deadline:
                info = client.model_info()
                if info.num_prefill_workers >= 1 and info.num_decode_workers >= 1:
                    return
                time.sleep(0.2)
        raise TimeoutError(f"the router did not see a prefill and a decode worker within {timeout_s:g} s; "
                           f"logs in {self._cluster.log_dir}")

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None

    def healthy(self) -> bool:
        cluster = self._cluster
        return cluster is not None and cluster.router.alive() and all(w.alive() for w in cluster.workers.values())

    def target(self) -> Target:
        return PdserveGrpcTarget(self._cluster.grpc_target)
