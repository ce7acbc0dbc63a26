"""The online loop against a real Redis: router summaries and worker records in, actuator calls and
published decisions out. The plan is the decision tests' synthetic one (3 req/s per prefill, 2 per
decode); the actuator records its calls (the real ones are tested on their own)."""

from __future__ import annotations

import asyncio
import json
import math
import uuid

import pytest
import redis.asyncio as aioredis

from pdserve.registry import Registry, WorkerRecord
from planner.decision import PlannerConfig, SloScale
from pdserve.keys import planner_decision_key, planner_decisions_key, router_load_key
from planner.online import LoopSettings, Oracle, PlannerLoop
from planner.pool_sizes import PoolSizes
from router.live_stats import LoadSummary


def plan(rate_rps: float, mean_prompt_tokens: float, mean_output_tokens: float, slo_scale: SloScale) -> PoolSizes:
    return PoolSizes(prefill=math.ceil(rate_rps / 3), decode=math.ceil(rate_rps / 2))


class RecordingActuator:
    def __init__(self, prefill: int, decode: int, fail: bool = False) -> None:
        self.sizes = {"prefill": prefill, "decode": decode}
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    def current(self) -> dict[str, int]:
        return dict(self.sizes)

    def scale(self, role: str, replicas: int) -> None:
        self.calls.append((role, replicas))
        if self.fail:
            raise RuntimeError("the backend refused: check its credentials")
        self.sizes[role] = replicas


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


CONFIG = PlannerConfig(ttft_slo_s=1.0, tpot_slo_s=0.1, max_sizes=PoolSizes(4, 4), scale_up_cooldown_s=30,
                       scale_down_cooldown_s=60, predictor="last")


@pytest.fixture
async def world(redis_server):
    cluster = f"t{uuid.uuid4().hex[:8]}"
    redis = aioredis.from_url(redis_server.url)
    registry = Registry(redis_server.url, cluster)
    for worker_id, role in (("p0", "prefill"), ("d0", "decode")):
        await registry.heartbeat(WorkerRecord(worker_id, role, "m", "127.0.0.1:1"), ttl_s=30)
    yield cluster, redis, registry
    await registry.close()
    await redis.aclose()


async def publish(redis, cluster: str, rate: float, tpot_p90_s: float = 0.05, router: str = "r1") -> None:
    summary = LoadSummary(router, 0.0, 10.0, 20, 2, rate, 100.0, 50.0, 0.2, 0.4, 0.03, tpot_p90_s)
    await redis.set(router_load_key(cluster, router), summary.to_json(), px=30_000)


def make_loop(world, actuator, clock=None, interval_s: float = 1.0) -> PlannerLoop:
    cluster, redis, registry = world
    return PlannerLoop(redis, registry, LoopSettings(cluster, interval_s=interval_s), CONFIG, Oracle(plan), actuator,
                       clock=clock or Clock())


async def test_a_load_step_scales_both_pools_and_publishes_the_decision(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=5.0)
    actuator = RecordingActuator(1, 1)
    tick = await make_loop(world, actuator).tick()
    assert tick.decision.target == PoolSizes(2, 3) and tick.applied
    assert actuator.calls == [("prefill", 2), ("decode", 3)]
    published = json.loads(await redis.get(planner_decision_key(cluster)))
    assert published["target"] == {"prefill": 2, "decode": 3} and published["applied"] is True
    assert published["observed"]["arrival_rate_rps"] == 5.0 and published["observed"]["ready"] == {
        "prefill": 1, "decode": 1}
    assert await redis.llen(planner_decisions_key(cluster)) == 1


async def test_growth_waits_for_starting_replicas_and_for_the_cooldown(world):
    cluster, redis, _ = world
    clock = Clock()
    actuator = RecordingActuator(1, 1)
    loop = make_loop(world, actuator, clock)
    await publish(redis, cluster, rate=5.0)
    await loop.tick()  # -> 2P + 3D asked for; the registry still shows 1P + 1D
    await publish(redis, cluster, rate=5.0, tpot_p90_s=0.5)  # TPOT breaks the SLO meanwhile
    clock.now += 40  # past the scale-up cooldown
    tick = await loop.tick()
    assert tick.decision.target == PoolSizes(2, 3) and not tick.applied
    assert "decode: hold at 3, 2 replica(s) still starting" in tick.decision.reasons
    assert actuator.calls == [("prefill", 2), ("decode", 3)]


async def test_no_router_holds_and_says_why(world):
    cluster, redis, _ = world
    actuator = RecordingActuator(1, 1)
    tick = await make_loop(world, actuator).tick()
    assert tick.decision is None and actuator.calls == []
    assert json.loads(await redis.get(planner_decision_key(cluster)))["note"] == "held: no router published live load"


async def test_an_actuator_failure_is_reported_and_the_loop_goes_on(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=5.0)
    loop = make_loop(world, RecordingActuator(1, 1, fail=True), interval_s=0.01)
    stop = asyncio.Event()
    seen = []

    def on_tick(tick) -> None:
        seen.append(tick)
        if len(seen) == 2:
            stop.set()

    await asyncio.wait_for(loop.run(stop, on_tick), timeout=10)
    assert len(seen) == 2 and not seen[0].applied
    assert seen[0].errors == ("scale prefill to 2: the backend refused: check its credentials",
                              "scale decode to 3: the backend refused: check its credentials")
    assert await redis.llen(planner_decisions_key(cluster)) == 2


class UnreachableActuator(RecordingActuator):
    def current(self) -> dict[str, int]:
        raise RuntimeError("cannot reach the API server: check the kubeconfig")


async def test_an_unreachable_actuator_holds_and_says_why(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=5.0)
    tick = await make_loop(world, UnreachableActuator(1, 1)).tick()
    assert tick.decision is None and not tick.applied
    assert json.loads(await redis.get(planner_decision_key(cluster)))["note"] == (
        "held: actuator unavailable: cannot reach the API server: check the kubeconfig")


async def test_a_first_decision_publishes_json_without_infinity(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=1.0)
    await make_loop(world, RecordingActuator(1, 1)).tick()
    raw = (await redis.get(planner_decision_key(cluster))).decode()
    assert "Infinity" not in raw and json.loads(raw)["observed"]["seconds_since_last_scale"] is None


async def test_the_scale_down_cooldown_counts_from_when_new_replicas_serve_not_from_the_decision(world):
    cluster, redis, registry = world
    clock = Clock()
    actuator = RecordingActuator(1, 1)
    loop = make_loop(world, actuator, clock)
    await publish(redis, cluster, rate=3.5)
    await loop.tick()  # -> 2P + 2D asked for; the new replicas take long to boot
    assert actuator.calls == [("prefill", 2), ("decode", 2)]
    clock.now += 100  # longer than the scale-down cooldown, still starting
    for worker_id, role in (("p1", "prefill"), ("d1", "decode")):
        await registry.heartbeat(WorkerRecord(worker_id, role, "m", "127.0.0.1:1"), ttl_s=30)
    await publish(redis, cluster, rate=0.5)  # the load is gone the moment they serve
    tick = await loop.tick()
    assert not tick.applied and "decode: hold at 2, scale-down cooldown (0s < 60s)" in tick.decision.reasons
    clock.now += 61
    tick = await loop.tick()
    assert tick.applied and actuator.sizes == {"prefill": 1, "decode": 1}
