"""The online planner on a real local cluster: a load step makes it add a decode worker, the router
uses it and attainment recovers; when the load drops it removes the worker by a drain, and no
request fails (one in flight on the removed worker finishes).

The cluster is 1 prefill (core 0) + 1 decode (core 1) on the tiny model; the planner's local
actuator may add one decode worker, also on core 1 (a decode engine sharing the prefill
engine's core starved the prefill worker's transfer threads here until pulls missed their lease). On the
tiny model a decode worker's cost is mostly per-token Python (its gRPC handler, output
processing), which a second worker splits. The TPOT SLO is set from what this host measures
under the load step on one decode worker (0.8x its median), so the step breaks it whatever the
machine's speed. While the new engine boots, the load pauses (on 2 cores the serving engines'
busy loops would starve its start for minutes; a real one boots on cores of its own).
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections import Counter
import time
from dataclasses import dataclass

import numpy as np
import pytest

from pdserve.client import AsyncClient, ServeError
from pdserve.engine import EngineSettings
from pdserve.launcher import ClusterSpec, LocalCluster
from planner.actuators.local import LocalActuator
from planner.actuators.local_processes import WorkerLaunchSpec, WorkerProcesses
from planner.decision import PlannerConfig
from planner.online import LoopSettings, PlannerLoop
from planner.pool_sizes import PoolSizes
from planner.profiles.example import EXAMPLE_PROFILE_PATH
from planner.service import PlanModelSpec, build_oracle

pytestmark = [
    pytest.mark.integration,
    # Opt-in until it holds on 2 cores: the added decode engine shares core 1 with the first one, and
    # in 3 of 4 runs here one of the two engines was starved for the whole measurement (38:0 and
    # 47:0 requests), so attainment after the scale-up measured the scheduler, not the planner.
    pytest.mark.skipif(os.environ.get("PDSERVE_PLANNER_E2E") != "1",
                       reason="opt-in (PDSERVE_PLANNER_E2E=1): two decode engines on one core starve each other"),
]

PROMPT_TOKENS, LOAD_STREAMS, LOAD_OUTPUT, TRICKLE_STREAMS, TRICKLE_OUTPUT = 32, 16, 64, 3, 200
TINY_PROFILE = EXAMPLE_PROFILE_PATH.with_name("tiny_2cpu.json")
TRANSPORT = "tcp"


@dataclass(frozen=True)
class Done:
    started_s: float
    finished_s: float
    tpot_s: float
    decode_worker: str


class TimedWorkerProcesses(WorkerProcesses):
    """Records when each worker was told to go (SIGTERM)."""

    def __init__(self, spec: WorkerLaunchSpec) -> None:
        super().__init__(spec)
        self.removed_at: dict[str, float] = {}
        self.exit_codes: dict[str, int] = {}

    def remove_worker(self, worker_id: str, timeout_s: float = 90.0) -> int:
        self.removed_at[worker_id] = time.monotonic()
        self.exit_codes[worker_id] = super().remove_worker(worker_id, timeout_s)
        return self.exit_codes[worker_id]


async def closed_loop(client: AsyncClient, streams: int, output_tokens: int, stop: asyncio.Event,
                      done: list[Done], errors: list[str], seed: int) -> None:
    rng = np.random.default_rng(seed)

    async def one_stream() -> None:
        while not stop.is_set():
            ids = [int(i) for i in rng.integers(10, 2000, PROMPT_TOKENS)]
            started = time.monotonic()
            try:
                async for chunk in client.generate(token_ids=ids, max_tokens=output_tokens, ignore_eos=True,
                                                   temperature=0.0):
                    last = chunk
            except ServeError as error:
                errors.append(f"{error.kind}: {error.message}")
                continue
            t = last.timings
            if t.output_tokens != output_tokens:
                errors.append(f"{t.output_tokens} tokens of {output_tokens} (decode worker {t.decode_worker!r})")
                continue
            done.append(Done(started, time.monotonic(), (t.e2e_s - t.ttft_s) / (t.output_tokens - 1), t.decode_worker))

    await asyncio.gather(*(one_stream() for _ in range(streams)))


def attainment(done: list[Done], tpot_slo_s: float) -> float:
    return sum(d.tpot_s <= tpot_slo_s for d in done) / len(done)


def history(loop: PlannerLoop) -> str:
    """The planner's ticks, for failure messages."""
    lines = []
    for tick in loop.ticks:
        if tick.decision is None:
            lines.append(tick.note)
            continue
        o, d = tick.observed, tick.decision
        tpot = f"{o.tpot_p90_s * 1e3:.1f}ms" if o.tpot_p90_s is not None else "-"
        lines.append(f"{d.current}->{d.target} applied={tick.applied} rate={o.arrival_rate_rps:.1f} tpot90={tpot} "
                     f"ready={o.ready}: {'; '.join(d.reasons)}")
    return "\n".join(lines)


async def wait_for(condition, timeout_s: float, what: str, loop: PlannerLoop | None = None) -> float:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n"
                                 + (history(loop) if loop else ""))
        await asyncio.sleep(0.2)
    return time.monotonic()


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    engine = EngineSettings(model=str(tiny_model), kv_cache_bytes=256 << 20, max_num_seqs=64)
    saved = {k: os.environ.get(k) for k in ("PDSERVE_LOAD_WINDOW_S", "PDSERVE_LOAD_INTERVAL_S")}
    os.environ.update(PDSERVE_LOAD_WINDOW_S="4", PDSERVE_LOAD_INTERVAL_S="0.5")  # read by the router at start
    try:
        spec = ClusterSpec(engine=engine, cpu_cores={"prefill": "0", "decode": "1"}, transport=TRANSPORT,
                           log_dir=str(tmp_path_factory.mktemp("planner-cluster")))
        local = LocalCluster(spec).start()
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    yield local
    local.stop()


async def test_planner_adds_a_decode_worker_under_a_load_step_and_drains_it_when_load_drops(cluster, tmp_path):
    processes = TimedWorkerProcesses(WorkerLaunchSpec(cluster.redis.url, "default", cluster.spec.engine, TRANSPORT,
                                                      cpu_cores={"decode": ("1",)}, log_dir=str(tmp_path)))
    actuator = LocalActuator(processes, unmanaged=PoolSizes(1, 1))
    done, errors, trickle = [], [], []
    client = AsyncClient(cluster.grpc_target)
    stop_load, stop_planner, stop_trickle = asyncio.Event(), asyncio.Event(), asyncio.Event()
    try:
        await wait_for_router(client)
        load = asyncio.create_task(closed_loop(client, LOAD_STREAMS, LOAD_OUTPUT, stop_load, done, errors, 1))
        await wait_for(lambda: len(done) >= 2 * LOAD_STREAMS, 120, "the load step to run on one decode worker")
        before = done[-2 * LOAD_STREAMS:]  # steady state of the step on one decode worker
        tpot_slo_s = 0.8 * statistics.median(d.tpot_s for d in before)

        config = PlannerConfig(ttft_slo_s=5.0, tpot_slo_s=tpot_slo_s, min_sizes=PoolSizes(1, 1),
                               max_sizes=PoolSizes(1, 2), scale_up_cooldown_s=2, scale_down_cooldown_s=60,
                               scale_down_headroom=1.0, predictor="last")  # shrink only with 2x to spare
        oracle = build_oracle(PlanModelSpec(TINY_PROFILE, 5.0, tpot_slo_s, sim_requests=100), max_devices=3)
        loop = PlannerLoop.connect(cluster.redis.url, LoopSettings("default", interval_s=1.0), config, oracle, actuator)
        planner = asyncio.create_task(loop.run(stop_planner))

        await wait_for(lambda: actuator.current()["decode"] == 2, 20, "the planner to add a decode worker", loop)
        (new_worker,) = processes.worker_ids("decode")
        # On 2 cores the serving engines' busy loops take every cycle: a new engine would need minutes
        # to boot under the load. A real one boots on cores of its own; here the load pauses meanwhile.
        stop_load.set()
        await load
        try:
            await asyncio.to_thread(processes.wait_ready, new_worker, 240)
        except RuntimeError as died:
            raise AssertionError(f"{died}\n{history(loop)}") from died
        # Open the new worker's KV connection (one handshake) with a few requests before the load, so
        # the measured requests start on a warm worker
        warm: list[Done] = []
        warmed = asyncio.Event()
        warming = asyncio.create_task(closed_loop(client, 2, 8, warmed, warm, errors, 4))
        await wait_for(lambda: any(d.decode_worker == new_worker for d in warm), 60, "a first request on the new worker")
        warmed.set()
        await warming
        stop_load = asyncio.Event()
        load = asyncio.create_task(closed_loop(client, LOAD_STREAMS, LOAD_OUTPUT, stop_load, done, errors, 3))
        # a fresh engine's first steps are slow (nothing is warm): judge once it has answered a request
        served_s = await wait_for(lambda: any(d.decode_worker == new_worker for d in done), 120,
                                  "a request answered by the new worker", loop)
        settled_s = served_s + 1
        await wait_for(lambda: sum(d.started_s > settled_s for d in done) >= 2 * LOAD_STREAMS, 120,
                       "requests sent once the new worker serves", loop)
        stop_load.set()
        await load
        after = [d for d in done if d.started_s > settled_s]
        used = Counter(d.decode_worker for d in after)
        assert used[new_worker] > 0, f"after {new_worker} was ready: {used}, errors {errors[:3]}\n{history(loop)}"
        print(f"TPOT SLO {tpot_slo_s * 1e3:.1f} ms; attainment {attainment(before, tpot_slo_s):.0%} on one decode "
              f"worker ({len(before)} requests), {attainment(after, tpot_slo_s):.0%} on two ({len(after)}: {used})")
        assert attainment(after, tpot_slo_s) >= max(0.5, attainment(before, tpot_slo_s) + 0.2), (
            f"SLO {tpot_slo_s * 1e3:.1f} ms: {attainment(before, tpot_slo_s):.0%} before, "
            f"{attainment(after, tpot_slo_s):.0%} after the new worker\n{history(loop)}")

        trickle_s = time.monotonic()
        trickling = asyncio.create_task(closed_loop(client, TRICKLE_STREAMS, TRICKLE_OUTPUT, stop_trickle, trickle,
                                                    errors, 2))
        await wait_for(lambda: new_worker in processes.removed_at, 120,
                       f"the planner to remove the decode worker (trickle TPOTs: "
                       f"{sorted(round(d.tpot_s * 1e3, 1) for d in trickle)[-10:]} ms)", loop)
        await asyncio.to_thread(actuator.wait_for_drains, 90)
        stop_trickle.set()
        await trickling
        removed_s = processes.removed_at[new_worker]
        in_flight = Counter(d.decode_worker for d in trickle if d.started_s < removed_s < d.finished_s)
        print(f"in flight when {new_worker} was told to drain ({removed_s - trickle_s:.1f} s into the trickle): "
              f"{dict(in_flight)}; it exited with {processes.exit_codes[new_worker]}")
        assert sum(in_flight.values()) > 0, f"nothing in flight at the scale-down\n{history(loop)}"
        assert processes.exit_codes[new_worker] == 0  # drained and exited on its own, not killed
        assert errors == []  # every request, those in flight on the drained worker included, completed
        targets = [t.decision.target.decode for t in loop.ticks if t.applied]
        assert targets == [2, 1], history(loop)  # one scale-up, one scale-down, no flapping
        assert actuator.current() == {"prefill": 1, "decode": 1} and processes.worker_ids("decode") == []
    finally:
        for event in (stop_load, stop_trickle, stop_planner):
            event.set()
        if "planner" in locals():
            await planner
            await loop.close()
        await asyncio.to_thread(processes.stop_all)
        await client.close()


async def wait_for_router(client: AsyncClient) -> None:
    """Until the router sees both workers, then two warm-up requests."""
    deadline = time.monotonic() + 30
    while True:
        info = await client.model_info()
        if info.num_prefill_workers and info.num_decode_workers:
            break
        assert time.monotonic() < deadline, "the router never saw the workers"
        await asyncio.sleep(0.1)
    for _ in range(2):
        async for _chunk in client.generate(token_ids=[11] * PROMPT_TOKENS, max_tokens=8, ignore_eos=True):
            pass
