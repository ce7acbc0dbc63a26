"""The systems bench/goodput_vs_vllm.py compares (`loadgen.comparison`), started and stopped on
demand (never two up at once: they share the machine's two cores).

- A `VllmServers.colocated`: vLLM's own OpenAI server, one engine bound to both cores.
- B `PdserveCluster`: a pdserve `LocalCluster`, 1 prefill worker on one core and 1 decode worker
  on the other, KV over the cluster's default transport (`auto`: shared memory on one host);
  `B-tcp` the same with KV over tcp; `B-hybrid` the same pools in the hybrid topology (the router
  may prefill on the decode worker); `B-agg` one aggregated worker on both cores.
- C `VllmServers.pair` (optional): two vLLM servers, one per core, requests dealt round robin by
  the client (no router process). It has B's "one core per engine" without disaggregation, so
  A vs C is what splitting the cores costs and C vs B what disaggregation adds or costs on top.
All run the same `EngineSettings` (model, dtype, block size, context, batch limit, seed) with the
same KV cache bytes in total: A's one engine gets what B's (or C's) two engines get together.
`servers` is how many servers a start brings up (the run's time budget estimates starts by it).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx

from loadgen.targets.base import Target
from loadgen.targets.openai_http import OpenAITarget
from loadgen.targets.pdserve_grpc import PdserveGrpcTarget
from loadgen.targets.round_robin import RoundRobinTarget
from loadgen.vllm_server import VllmOpenAIServer
from pdserve.engine import EngineSettings
from launch.local import ClusterSpec, LocalCluster
from pdserve.roles import Topology
from pdserve.cpu_placement import parse_cores
from loadgen.proc_cpu import named_threads_cpu_s


class VllmServers:
    """One vLLM OpenAI server per entry of `cores` (a VLLM_CPU_OMP_THREADS_BIND value each)."""

    def __init__(self, key: str, label: str, settings: EngineSettings, cores: list[str], log_dir: Path) -> None:
        self.key, self.label = key, label
        self.settings = [replace(settings, cpu_cores=c) for c in cores]
        self.servers = len(cores)
        self.log_dir = log_dir
        self._running: list[VllmOpenAIServer] = []

    @classmethod
    def colocated(cls, settings: EngineSettings, cores: str, log_dir: Path, key: str = "A") -> "VllmServers":
        """A: one engine on `cores` with twice a worker's KV cache bytes (A-<n>: `settings` carry
        max_num_batched_tokens n)."""
        doubled = replace(settings, kv_cache_bytes=2 * settings.kv_cache_bytes)
        chunk = "" if settings.max_num_batched_tokens is None else f", max_num_batched_tokens {settings.max_num_batched_tokens}"
        return cls(key, f"{key}: vLLM colocated (cores {cores}{chunk})", doubled, [cores], log_dir)

    @classmethod
    def pair(cls, settings: EngineSettings, cores: tuple[str, str], log_dir: Path) -> "VllmServers":
        """C: one engine per core, each with a worker's KV cache bytes."""
        return cls("C", f"C: 2 x vLLM (cores {cores[0]} and {cores[1]}), round robin", settings, list(cores), log_dir)

    def start(self) -> None:
        try:
            for i, settings in enumerate(self.settings):
                log = self.log_dir / f"vllm_{self.key}{i}.log"
                self._running.append(VllmOpenAIServer(settings, log_path=log).start())
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        running, self._running = self._running, []
        for server in running:
            server.stop()

    def healthy(self) -> bool:
        if len(self._running) != len(self.settings):
            return False
        try:
            return all(httpx.get(f"{s.url}/health", timeout=5.0).status_code == 200 for s in self._running)
        except httpx.HTTPError:
            return False

    def target(self) -> Target:
        members = [OpenAITarget(s.url) for s in self._running]  # model: the one each server lists
        return members[0] if len(members) == 1 else RoundRobinTarget(members)


class PdserveCluster:
    """A pdserve `LocalCluster` on the comparison's cores: `fixed` (1 prefill + 1 decode worker, one
    core each, disaggregated or hybrid; or one aggregated worker on every core with a worker's KV
    cache doubled, as A's) or `sized` (any pools, one core per worker: what `pdserve plan` picked). `router_flags`: SLOs and
    policy files for the router."""

    servers = 1  # one cluster start

    def __init__(self, key: str, label: str, spec: ClusterSpec) -> None:
        self.key, self.label, self.spec = key, label, spec
        self._cluster: LocalCluster | None = None

    @classmethod
    def fixed(cls, settings: EngineSettings, prefill_cores: str, decode_cores: str, log_dir: Path,
              transport: str = "auto", key: str = "B", topology: Topology = "disaggregated",
              router_flags: tuple[str, ...] = ()) -> "PdserveCluster":
        """1 prefill + 1 decode worker (one core each), or for `aggregated` one worker on both."""
        logs = str(log_dir / f"pdserve-{key}")
        if topology == "aggregated":
            both = f"{prefill_cores},{decode_cores}"
            spec = ClusterSpec(engine=replace(settings, kv_cache_bytes=2 * settings.kv_cache_bytes),
                               num_prefill=0, num_decode=1, transport=transport, topology=topology,
                               cpu_cores={"decode": both}, log_dir=logs, router_flags=router_flags)
            return cls(key, f"{key}: pdserve 1 aggregated worker (cores {both})", spec)
        spec = ClusterSpec(engine=settings, num_prefill=1, num_decode=1, transport=transport,
                           cpu_cores={"prefill": prefill_cores, "decode": decode_cores}, topology=topology,
                           log_dir=logs, router_flags=router_flags)
        return cls(key, f"{key}: pdserve {topology} 1 prefill (core {prefill_cores}) + 1 decode "
                        f"(core {decode_cores}), KV over {transport}", spec)

    @classmethod
    def sized(cls, settings: EngineSettings, prefill_cores: str, decode_cores: str, log_dir: Path, transport: str,
              key: str, topology: Topology, num_prefill: int, num_decode: int,
              router_flags: tuple[str, ...] = (), cores_per_worker: int = 1) -> "PdserveCluster":
        """`num_prefill` + `num_decode` workers (for `aggregated`, 0 + K), `cores_per_worker` cores
        each as the planner counts devices (`Topology.devices_per_instance`; more than one only for
        aggregated workers, each with the KV cache of all its cores): the comparison's cores in
        order, the first to the prefill pool, the next to the decode workers. ValueError when the
        workers need more cores than the comparison has."""
        cores = sorted(parse_cores(f"{prefill_cores},{decode_cores}"))
        workers = num_prefill + num_decode
        if workers * cores_per_worker > len(cores):
            raise ValueError(f"{key} runs {workers} workers of {cores_per_worker} cores, the comparison has "
                             f"{len(cores)} cores")
        if cores_per_worker > 1 and topology != "aggregated":
            raise ValueError(f"{key}: only aggregated workers span cores, not {topology} ones")
        joined = lambda chosen: ",".join(map(str, chosen))  # noqa: E731
        used = workers * cores_per_worker
        engine = replace(settings, kv_cache_bytes=settings.kv_cache_bytes * cores_per_worker)
        spec = ClusterSpec(engine=engine, num_prefill=num_prefill, num_decode=num_decode, transport=transport,
                           topology=topology, log_dir=str(log_dir / f"pdserve-{key}"), router_flags=router_flags,
                           cpu_cores={"prefill": joined(cores[:num_prefill]), "decode": joined(cores[num_prefill:used])})
        each = "one core each" if cores_per_worker == 1 else f"{cores_per_worker} cores each"
        return cls(key, f"{key}: pdserve {topology} {num_prefill} prefill + {num_decode} decode, {each} "
                        f"(cores {joined(cores[:used])})", spec)

    @property
    def cluster(self) -> LocalCluster | None:
        """The running `LocalCluster`; None before `start` and after `stop`."""
        return self._cluster

    def kv_producer_cpu_s(self) -> float:
        """CPU seconds the prefill workers' KV server threads (`pdserve-kv-*`) have used so far:
        what serving transfers costs the producer (the prefill compute is not in it). Read it
        before and after a run; connection threads live as long as the decode worker's connection."""
        cluster = self._cluster
        if cluster is None:
            return 0.0
        return sum(named_threads_cpu_s(worker.pid, "pdserve-kv-")
                   for name, worker in cluster.workers.items() if name.startswith("prefill") and worker.pid)

    def router_metrics_url(self) -> str | None:
        """The router's Prometheus endpoint while the cluster runs (its admission's calibration is
        there: `loadgen.comparison.admission`); None when it is not running."""
        return None if self._cluster is None else f"{self._cluster.http_url}/metrics"

    def start(self) -> None:
        self._cluster = LocalCluster(self.spec).start()  # returns once its router routes to both workers

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None

    def healthy(self) -> bool:
        cluster = self._cluster
        return cluster is not None and cluster.router.alive() and all(w.alive() for w in cluster.workers.values())

    def target(self) -> Target:
        return PdserveGrpcTarget(self._cluster.grpc_target)
