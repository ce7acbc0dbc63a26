"""The online loop's model-error step against a real Redis: it records predicted against observed
latency every tick, publishes them (the decision JSON, the Prometheus gauges), feeds its
correction to the decision, and does not follow the model's plan while the gate refuses (an
observed SLO break still grows a pool).

The seams are those of tests/unit/planner_online/test_planner_loop.py: the synthetic plan (3 req/s
per prefill, 2 per decode), an actuator that records its calls, a settable clock. The latency
model is a stub off the published observation by a chosen factor."""

from __future__ import annotations

import json
import math
import uuid

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from pdserve.keys import planner_decision_key, router_load_key
from pdserve.registry import Registry, WorkerRecord
from planner.decision import PlannerConfig, SloScale
from planner.model_error import ErrorConfig, Latencies
from planner.online import MODEL_NOT_TRUSTED, LoopSettings, Oracle, PlannerLoop
from planner.pool_sizes import PoolSizes
from planner_testkit import RecordingActuator
from router.live_stats import LoadSummary

OBSERVED = Latencies(ttft_p50_s=0.2, ttft_p90_s=0.4, tpot_p50_s=0.03, tpot_p90_s=0.05)  # what `publish` says
CONFIG = PlannerConfig(ttft_slo_s=1.0, tpot_slo_s=0.1, max_sizes=PoolSizes(4, 4), scale_up_cooldown_s=30,
                       scale_down_cooldown_s=60, predictor="last")


def plan(rate_rps: float, mean_prompt_tokens: float, mean_output_tokens: float, slo_scale: SloScale) -> PoolSizes:
    return PoolSizes(prefill=math.ceil(rate_rps / 3), decode=math.ceil(rate_rps / 2))


def model_off_by(ttft: float, tpot: float = 1.0):
    """A latency model that predicts the observed latencies divided by these factors."""
    calls = []

    def latency(sizes: PoolSizes, rate_rps: float, mean_prompt_tokens: float, mean_output_tokens: float):
        calls.append((sizes, rate_rps, mean_prompt_tokens, mean_output_tokens))
        return Latencies(OBSERVED.ttft_p50_s / ttft, OBSERVED.ttft_p90_s / ttft, OBSERVED.tpot_p50_s / tpot,
                         OBSERVED.tpot_p90_s / tpot)

    latency.calls = calls
    return latency


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


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


async def publish(redis, cluster: str, rate: float, observed: Latencies = OBSERVED) -> None:
    o = observed  # 20 requests finished over a 10 s window, 100 prompt and 50 output tokens on average
    summary = LoadSummary("r1", 0.0, 10.0, 20, 2, rate, 100.0, 50.0, o.ttft_p50_s, o.ttft_p90_s, o.tpot_p50_s,
                          o.tpot_p90_s)
    await redis.set(router_load_key(cluster, "r1"), summary.to_json(), px=30_000)


def make_loop(world, actuator, latency, error: ErrorConfig = ErrorConfig(), clock=None) -> PlannerLoop:
    cluster, redis, registry = world
    settings = LoopSettings(cluster, interval_s=1.0, model_error=error)
    return PlannerLoop(redis, registry, settings, CONFIG, Oracle(plan, latency=latency), actuator,
                       clock=clock or Clock())


async def test_a_model_beyond_the_error_bound_does_not_scale_and_says_why(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=5.0)  # a load step the plan sizes at 2P+3D; the SLOs are met
    actuator = RecordingActuator(1, 1)
    tick = await make_loop(world, actuator, model_off_by(ttft=2.0), ErrorConfig(min_intervals=1)).tick()
    assert tick.decision.target == PoolSizes(1, 1) and not tick.applied
    assert actuator.calls == []
    assert tick.note == (f"{MODEL_NOT_TRUSTED}: recent TTFT p90 error 50% > bound 25% over the last 1 interval "
                         "(TTFT p90 50%, TPOT p90 0%)")
    published = json.loads(await redis.get(planner_decision_key(cluster)))
    assert published["note"] == tick.note and published["target"] == {"prefill": 1, "decode": 1}
    assert published["applied"] is False and published["model"]["may_act"] is False
    assert published["model"]["metrics"]["ttft_p90"]["predicted_s"] == 0.2
    assert published["model"]["metrics"]["ttft_p90"]["observed_s"] == 0.4
    assert REGISTRY.get_sample_value("pdserve_planner_model_trusted") == 0
    assert REGISTRY.get_sample_value("pdserve_planner_predicted_ttft_p90_seconds") == 0.2
    assert REGISTRY.get_sample_value("pdserve_planner_observed_ttft_p90_seconds") == 0.4
    assert REGISTRY.get_sample_value("pdserve_planner_model_error_ttft_p90_ratio") == -0.5


async def test_an_observed_slo_break_still_grows_its_pool_while_the_model_is_not_trusted(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=5.0, observed=Latencies(0.2, 0.4, 0.1, 0.15))  # TPOT p90 over its 0.1 s
    actuator = RecordingActuator(1, 1)
    tick = await make_loop(world, actuator, model_off_by(ttft=2.0), ErrorConfig(min_intervals=1)).tick()
    assert tick.applied and actuator.calls == [("decode", 2)]  # the guard's +1, not the plan's 2P+3D
    assert "decode: observed p90 TPOT 0.15s > SLO 0.1s: +1" in tick.decision.reasons
    assert tick.note.startswith(MODEL_NOT_TRUSTED)


async def test_a_model_within_the_bound_scales_and_is_asked_about_the_observed_load(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=5.0)
    actuator, latency = RecordingActuator(1, 1), model_off_by(ttft=1.1)
    tick = await make_loop(world, actuator, latency, ErrorConfig(min_intervals=1)).tick()
    assert tick.applied and actuator.calls == [("prefill", 2), ("decode", 3)]
    assert latency.calls == [(PoolSizes(1, 1), 5.0, 100.0, 50.0)]  # the serving pools at the observed load
    assert tick.model["may_act"] is True
    assert REGISTRY.get_sample_value("pdserve_planner_model_trusted") == 1


async def test_the_loop_holds_until_enough_intervals_were_judged(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=5.0)
    actuator = RecordingActuator(1, 1)
    loop = make_loop(world, actuator, model_off_by(ttft=1.0))  # a perfect model; 3 intervals needed
    notes = [(await loop.tick()).note for _ in range(3)]
    assert notes[:2] == [f"{MODEL_NOT_TRUSTED}: only {n} of the 3 intervals needed were observed with >= 10 "
                         "finished requests: the model's error is not known yet" for n in (1, 2)]
    assert notes[2] == "" and actuator.calls == [("prefill", 2), ("decode", 3)]


async def test_the_tracked_correction_reaches_the_decision(world):
    cluster, redis, _ = world
    await publish(redis, cluster, rate=1.0)
    loop = make_loop(world, RecordingActuator(1, 1), model_off_by(ttft=1.0, tpot=2.0), ErrorConfig(max_error=math.inf))
    tick = await loop.tick()
    assert "model correction (tracked): TTFT x1.00, TPOT x1.41" in tick.decision.reasons  # 2 ** 0.5 after one
    assert loop.model.slo_scale().tpot == pytest.approx(2 ** -0.5)


async def test_an_interval_right_after_the_serving_pools_changed_is_not_scored(world):
    cluster, redis, registry = world
    await publish(redis, cluster, rate=5.0)
    clock = Clock()
    loop = make_loop(world, RecordingActuator(1, 1), model_off_by(ttft=1.0), ErrorConfig(min_intervals=1), clock)
    assert (await loop.tick()).applied
    await registry.heartbeat(WorkerRecord("p1", "prefill", "m", "127.0.0.1:1"), ttl_s=30)  # a new replica serves
    clock.now += 4
    tick = await loop.tick()
    assert tick.model["skipped"] == "the serving pools changed 0 s ago, within the routers' 10 s window"
    assert tick.model["scored_intervals"] == 1
    clock.now += 11
    assert (await loop.tick()).model["scored"] is True
