"""The online planner on a real local cluster: a load step makes it add a worker, the router uses
it and attainment recovers; when the load drops it removes the worker by a drain, and no request
fails (one in flight on the removed worker finishes).

The cluster is 1 prefill (core 0) + 1 decode (core 1) on the tiny model, and the host has no third
core, so the step must be one the cluster has room for: long prompts and short outputs saturate
the prefill core while the decode core idles, and the planner's local actuator may add one
prefill worker, on core 1. (A decode-heavy step leaves no room here: the router's and the
client's per-token Python take what the prefill core has spare, and a second decode engine on it
made TPOT worse, not better.) The TTFT SLO is set from what this host measures on one prefill
worker: 0.8x the step's median, so the step breaks it whatever the machine's speed, and at least
twice the p90 of the trickle (one request at a time) that the drain phase runs, so the planner has
no reason to add the worker back once it has drained it.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from pdserve.client import AsyncClient, ServeError
from pdserve.engine import EngineSettings
from launch.local import ClusterSpec, LocalCluster
from planner.actuators.local import LocalActuator
from planner.actuators.local_processes import WorkerLaunchSpec, WorkerProcesses
from planner.decision import PlannerConfig
from planner.model_error import ErrorConfig
from planner.online import LoopSettings, PlannerLoop
from planner.pool_sizes import PoolSizes, Role
from planner.profiles.example import EXAMPLE_PROFILE_PATH
from planner.service import PlanModelSpec, build_oracle

pytestmark = [pytest.mark.integration, pytest.mark.judges_latency]

PROMPT_TOKENS, OUTPUT_TOKENS, LOAD_STREAMS, TRICKLE_STREAMS = 1500, 4, 6, 1
TRICKLE_THINK_S = 1.0  # a pause between the trickle's requests: one at a time, never queued
# The drain phase's pause is longer, and its intervals are scored however few requests they hold
# (`min_finished_requests=1` below): at the default 10, a trickle's intervals are never scored, the
# planner keeps the model correction it learned under the step (TTFT x2.4 on one CI run, where the
# trickle alone ran at 0.65x the raw model) and, asked for room at twice the trickle's rate
# (scale_down_headroom=1.0), a fast host's tight SLO refused one prefill worker: it never drained.
DRAIN_THINK_S = 3.0
TINY_PROFILE = EXAMPLE_PROFILE_PATH.with_name("tiny_2cpu.json")
# No shrink within this long of the new worker serving (the loop restarts the clock then): long
# enough that the load step has ended on every host kind before the planner may shrink.
SCALE_DOWN_COOLDOWN_S = 60.0
TRANSPORT = "tcp"
TPOT_SLO_S = 1.0  # decode is not what this test loads


@dataclass(frozen=True)
class Done:
    started_s: float
    finished_s: float
    ttft_s: float
    prefill_worker: str


class TimedWorkerProcesses(WorkerProcesses):
    """Records every add and remove the planner asked for, and when each worker was told to go."""

    def __init__(self, spec: WorkerLaunchSpec) -> None:
        super().__init__(spec)
        self.removed_at: dict[str, float] = {}
        self.exit_codes: dict[str, int] = {}
        self.actions: list[str] = []  # "+prefill", "-<worker id>", in order

    def add_worker(self, role: Role, wait: bool = True, timeout_s: float = 240.0) -> str:
        self.actions.append(f"+{role}")
        return super().add_worker(role, wait, timeout_s)

    def remove_worker(self, worker_id: str, timeout_s: float = 90.0) -> int:
        self.actions.append(f"-{worker_id}")
        self.removed_at[worker_id] = time.monotonic()
        self.exit_codes[worker_id] = super().remove_worker(worker_id, timeout_s)
        return self.exit_codes[worker_id]


async def closed_loop(client: AsyncClient, streams: int, stop: asyncio.Event, done: list[Done], errors: list[str],
                      seed: int, think_s: float = 0.0) -> None:
    rng = np.random.default_rng(seed)

    async def one_stream() -> None:
        while not stop.is_set():
            ids = [int(i) for i in rng.integers(10, 2000, PROMPT_TOKENS)]  # unique: no prefix-cache hits
            started = time.monotonic()
            try:
                async for chunk in client.generate(token_ids=ids, max_tokens=OUTPUT_TOKENS, ignore_eos=True,
                                                   temperature=0.0):
                    last = chunk
            except ServeError as error:
                errors.append(f"{error.kind}: {error.message}")
                continue
            t = last.timings
            if t.output_tokens != OUTPUT_TOKENS:
                errors.append(f"{t.output_tokens} tokens of {OUTPUT_TOKENS} (prefill worker {t.prefill_worker!r})")
                continue
            done.append(Done(started, time.monotonic(), t.ttft_s, t.prefill_worker))
            await asyncio.sleep(think_s)

    await asyncio.gather(*(one_stream() for _ in range(streams)))


def attainment(done: list[Done], ttft_slo_s: float) -> float:
    return sum(d.ttft_s <= ttft_slo_s for d in done) / len(done)


def history(loop: PlannerLoop) -> str:
    """The planner's ticks, for failure messages."""
    lines = []
    for tick in loop.ticks:
        if tick.decision is None:
            lines.append(tick.note)
            continue
        o, d = tick.observed, tick.decision
        ttft = f"{o.ttft_p90_s * 1e3:.1f}ms" if o.ttft_p90_s is not None else "-"
        lines.append(f"{d.current}->{d.target} applied={tick.applied} rate={o.arrival_rate_rps:.1f} ttft90={ttft} "
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


async def test_planner_adds_a_prefill_worker_under_a_load_step_and_drains_it_when_load_drops(cluster, tmp_path):
    processes = TimedWorkerProcesses(WorkerLaunchSpec(cluster.redis.url, "default", cluster.spec.engine, TRANSPORT,
                                                      cpu_cores={"prefill": ("1",)}, log_dir=str(tmp_path),
                                                      cluster_secret_file=str(cluster.secret_file),
                                                      redis_password_file=str(cluster.redis_password_file)))
    actuator = LocalActuator(processes, unmanaged=PoolSizes(1, 1))
    done, errors, trickle = [], [], []
    client = AsyncClient(cluster.grpc_target)
    stop_load, stop_planner, stop_trickle = asyncio.Event(), asyncio.Event(), asyncio.Event()
    try:
        await warm_up(client)
        quiet = await trickle_alone(client, errors)  # what the drain phase will run, measured before the step
        load = asyncio.create_task(closed_loop(client, LOAD_STREAMS, stop_load, done, errors, 1))
        await wait_for(lambda: len(done) >= 4 * LOAD_STREAMS, 120, "the load step to run on one prefill worker")
        before = done[-4 * LOAD_STREAMS:]  # steady state of the step on one prefill worker
        # The SLO: broken by the step, kept by the trickle with room (a trickle near the SLO makes the
        # planner add the worker back after draining it: right for the planner, flapping for this test).
        quiet_p90_s = float(np.percentile([d.ttft_s for d in quiet], 90))
        ttft_slo_s = max(0.8 * statistics.median(d.ttft_s for d in before), 2 * quiet_p90_s)
        print(f"TTFT p90 of the trickle alone {quiet_p90_s * 1e3:.1f} ms, median under the step "
              f"{statistics.median(d.ttft_s for d in before) * 1e3:.1f} ms")
        assert attainment(before, ttft_slo_s) <= 0.5, (
            f"the step does not break an SLO of {ttft_slo_s * 1e3:.1f} ms (twice the trickle's p90): this host "
            f"queues too little under {LOAD_STREAMS} streams for the test to mean anything")

        config = PlannerConfig(ttft_slo_s=ttft_slo_s, tpot_slo_s=TPOT_SLO_S, min_sizes=PoolSizes(1, 1),
                               max_sizes=PoolSizes(2, 1), scale_up_cooldown_s=2, scale_down_cooldown_s=SCALE_DOWN_COOLDOWN_S,
                               scale_down_headroom=1.0, predictor="last")  # shrink only with 2x to spare
        oracle = build_oracle(PlanModelSpec(TINY_PROFILE, ttft_slo_s, TPOT_SLO_S, sim_requests=100), max_devices=3)
        # The gate on the model's error is off: this proves the scaling mechanics, on a profile of
        # another host whose error here depends on this host's speed (the gate: tests/unit/planner/test_planner_model_gate.py).
        settings = LoopSettings("default", interval_s=1.0, model_error=ErrorConfig(max_error=math.inf,
                                                                                     min_finished_requests=1))
        loop = PlannerLoop.connect(cluster.redis.client_url, settings, config, oracle, actuator)
        planner = asyncio.create_task(loop.run(stop_planner))

        await wait_for(lambda: actuator.current()["prefill"] == 2, 30, "the planner to add a prefill worker", loop)
        (new_worker,) = processes.worker_ids("prefill")
        try:  # under the load
            await asyncio.to_thread(processes.wait_ready, new_worker, 240)
        except RuntimeError as died:
            raise AssertionError(f"{died}\n{history(loop)}") from died
        # a fresh engine's first steps are slow (nothing is warm): judge once it has answered a request
        served_s = await wait_for(lambda: any(d.prefill_worker == new_worker for d in done), 120,
                                  "a request prefilled by the new worker", loop)
        settled_s = served_s + 1
        await wait_for(lambda: sum(d.started_s > settled_s for d in done) >= 4 * LOAD_STREAMS, 120,
                       "requests sent once the new worker serves", loop)
        stop_load.set()
        await load
        after = [d for d in done if d.started_s > settled_s]
        used = Counter(d.prefill_worker for d in after)
        assert used[new_worker] > 0, f"after {new_worker} was ready: {used}, errors {errors[:3]}\n{history(loop)}"
        print(f"TTFT SLO {ttft_slo_s * 1e3:.1f} ms; attainment {attainment(before, ttft_slo_s):.0%} on one prefill "
              f"worker ({len(before)} requests), {attainment(after, ttft_slo_s):.0%} on two ({len(after)}: {used})")
        assert attainment(after, ttft_slo_s) >= max(0.5, attainment(before, ttft_slo_s) + 0.2), (
            f"SLO {ttft_slo_s * 1e3:.1f} ms: {attainment(before, ttft_slo_s):.0%} before, "
            f"{attainment(after, ttft_slo_s):.0%} after the new worker\n{history(loop)}")

        trickle_s = time.monotonic()
        trickling = asyncio.create_task(closed_loop(client, TRICKLE_STREAMS, stop_trickle, trickle, errors, 2,
                                                    think_s=DRAIN_THINK_S))
        await wait_for(lambda: new_worker in processes.removed_at, 120,
                       "the planner to remove the prefill worker", loop)
        await asyncio.to_thread(actuator.wait_for_drains, 90)
        removed_s = processes.removed_at[new_worker]
        # the cluster keeps serving after the drain: a trickle request sent after it (a drained worker
        # exits within a second now, less than the trickle's pause, so wait for one rather than hope)
        await wait_for(lambda: any(d.started_s > removed_s for d in trickle), 60,
                       "a trickle request sent after the drain to be served", loop)
        stop_trickle.set()
        await trickling
        print(f"{new_worker} told to drain {removed_s - trickle_s:.1f} s into the trickle; "
              f"it exited with {processes.exit_codes[new_worker]}")
        assert processes.exit_codes[new_worker] == 0  # drained and exited on its own, not killed
        assert errors == []  # every request, those in flight on the drained worker included, completed
        assert any(d.started_s > removed_s for d in trickle)  # the cluster kept serving after the drain
        # one scale-up, one scale-down, no flapping (the whole run: loop.ticks keeps only the latest)
        assert processes.actions == ["+prefill", f"-{new_worker}"], history(loop)
        assert actuator.current() == {"prefill": 1, "decode": 1} and processes.worker_ids("prefill") == []
    finally:
        for event in (stop_load, stop_trickle, stop_planner):
            event.set()
        if "planner" in locals():
            await planner
            await loop.close()
        await asyncio.to_thread(processes.stop_all)
        await client.close()


async def trickle_alone(client: AsyncClient, errors: list[str], requests: int = 12) -> list[Done]:
    """The trickle on the cluster as it starts (one prefill worker): what the drain phase must keep."""
    stop, done = asyncio.Event(), []
    trickling = asyncio.create_task(closed_loop(client, TRICKLE_STREAMS, stop, done, errors, 3, think_s=TRICKLE_THINK_S))
    await wait_for(lambda: len(done) >= requests, 120, "the trickle on one prefill worker")
    stop.set()
    await trickling
    return done


async def warm_up(client: AsyncClient) -> None:
    """Two requests through both workers (LocalCluster.start returned once the router saw them)."""
    for _ in range(2):
        async for _chunk in client.generate(token_ids=[11] * 64, max_tokens=8, ignore_eos=True):
            pass
