"""The online planner switches a real cluster's topology, disaggregated (1 prefill + 1 decode
worker) to aggregated (2 workers serving both phases): the router places for the published
topology at once, the planner starts the new worker before it drains the prefill worker, the
drained worker exits on its own, and no request of a trickle sent throughout fails.

The plan is a stand-in (two aggregated workers): this proves the mechanics on real processes;
which topology the model picks, and when, is tests/unit/planner/test_topology_switch.py."""

from __future__ import annotations

import asyncio
import inspect
import os
import time

import pytest

from cluster_helpers import engine_settings
from launch.local import ClusterSpec, LocalCluster
from pdserve.client import AsyncClient, ServeError
from pdserve.keys import topology_key
from planner.actuators.local import LocalActuator
from planner.actuators.local_processes import WorkerLaunchSpec, WorkerProcesses
from planner.decision import PlannerConfig
from planner.live import merge_loads, read_router_loads
from planner.online import LoopSettings, Oracle, PlannerLoop
from planner.pool_sizes import PoolSizes

pytestmark = pytest.mark.integration

TWO_AGGREGATED = PoolSizes(prefill=0, decode=2)


class ExitCodes(WorkerProcesses):
    def __init__(self, spec: WorkerLaunchSpec) -> None:
        super().__init__(spec)
        self.exit_codes: dict[str, int] = {}

    def remove_worker(self, worker_id: str, timeout_s: float = 90.0) -> int:
        self.exit_codes[worker_id] = super().remove_worker(worker_id, timeout_s)
        return self.exit_codes[worker_id]


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    """The router and one decode worker (core 1); the planner's own workers join it on core 0."""
    saved = os.environ.get("PDSERVE_LOAD_INTERVAL_S")
    os.environ["PDSERVE_LOAD_INTERVAL_S"] = "0.5"  # the router publishes its load twice a second
    try:
        spec = ClusterSpec(engine=engine_settings(tiny_model), num_prefill=0, num_decode=1, transport="tcp",
                           cpu_cores={"decode": "1"}, log_dir=str(tmp_path_factory.mktemp("topology-switch")))
        local = LocalCluster(spec).start()
    finally:
        os.environ.pop("PDSERVE_LOAD_INTERVAL_S") if saved is None else os.environ.__setitem__(
            "PDSERVE_LOAD_INTERVAL_S", saved)
    yield local
    local.stop()


async def wait_for(condition, timeout_s: float, what: str) -> None:
    """Until `condition()` (a plain or an async function) holds; fails naming `what` past the deadline."""
    deadline = time.monotonic() + timeout_s
    while not await _holds(condition):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(0.1)


async def _holds(condition) -> bool:
    result = condition()
    return bool(await result) if inspect.isawaitable(result) else bool(result)


async def test_the_planner_switches_a_live_cluster_to_aggregated_without_losing_a_request(cluster, tmp_path):
    processes = ExitCodes(WorkerLaunchSpec(cluster.redis.url, "default", cluster.spec.engine, "tcp",
                                           cpu_cores={"prefill": ("0",), "decode": ("0",)}, log_dir=str(tmp_path),
                                           cluster_secret_file=str(cluster.secret_file),
                                           redis_password_file=str(cluster.redis_password_file)))
    prefill_id = await asyncio.to_thread(processes.add_worker, "prefill")  # the planner's, so it may drain it
    actuator = LocalActuator(processes, unmanaged=PoolSizes(0, 1))
    client = AsyncClient(cluster.grpc_target)
    served, errors, stop = [], [], asyncio.Event()

    sent = iter(range(10**6))

    async def trickle() -> None:
        while not stop.is_set():
            sent_s, n = time.monotonic(), next(sent)
            prompt = [10 + (n * 7919 + i * 13) % 1500 for i in range(96)]  # no two share a cached prefix
            try:
                async for chunk in client.generate(token_ids=prompt, max_tokens=8, ignore_eos=True):
                    last = chunk
                served.append((sent_s, last.timings))
            except ServeError as error:
                errors.append(f"{error.kind}: {error.message}")
            await asyncio.sleep(0.2)

    config = PlannerConfig(ttft_slo_s=10.0, tpot_slo_s=10.0, max_sizes=PoolSizes(1, 2), predictor="last",
                           topologies=("aggregated",))
    loop = PlannerLoop.connect(cluster.redis.client_url, LoopSettings("default", interval_s=1.0), config,
                               Oracle(plan=lambda *_: PoolSizes(1, 1), plans={"aggregated": lambda *_: TWO_AGGREGATED}),
                               actuator)
    sending = asyncio.gather(trickle(), trickle())  # two at a time: both aggregated workers get some
    try:
        await wait_for(lambda: any(t.prefill_worker == prefill_id for _, t in served), 60,
                       "a request prefilled by the prefill worker")
        # the first decision must see the traffic: a router load published before any arrival
        # counted says 0 req/s, and the planner sizes the pools to their minimum for it
        async def traffic_published() -> bool:
            live = merge_loads(await read_router_loads(loop.redis, "default"))
            return live is not None and live.arrival_rate_rps > 0

        await wait_for(traffic_published, 60, "a router load with traffic")
        tick = await loop.tick()
        while tick.decision is None:  # the router has not published its load yet
            await asyncio.sleep(0.5)
            tick = await loop.tick()
        switched_s = time.monotonic()
        assert tick.topology == "aggregated" and tick.applied, tick
        assert "not allowed" in tick.decision.reasons[0]
        assert await loop.redis.get(topology_key("default")) == b"aggregated"
        assert actuator.current() == {"prefill": 0, "decode": 2}, (tick.observed, tick.decision.reasons)

        (new_worker,) = processes.worker_ids("decode")
        await asyncio.to_thread(processes.wait_ready, new_worker, 240)
        await asyncio.to_thread(actuator.wait_for_drains, 90)
        assert processes.exit_codes == {prefill_id: 0}  # drained and exited on its own, not killed
        drained_s = time.monotonic()
        await wait_for(lambda: sum(sent_s > drained_s for sent_s, _ in served) >= 6, 60,
                       "requests sent after the drain")
        await wait_for(lambda: any(t.decode_worker == new_worker for _, t in served), 60,
                       "a request on the new aggregated worker")
        info = await client.model_info()
        assert (info.num_prefill_workers, info.num_decode_workers) == (0, 2)
    finally:
        stop.set()
        await sending
        await loop.close()
        await asyncio.to_thread(processes.stop_all)
        await client.close()
    assert errors == []  # every request, those in flight on the drained worker included, completed
    after = [t for sent_s, t in served if sent_s > switched_s + 1.0]  # the routers refresh within 0.25 s
    assert after and not any(t.disaggregated for t in after), [t.prefill_worker for t in after]
