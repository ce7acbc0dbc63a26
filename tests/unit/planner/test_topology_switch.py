"""The online planner's topology choice (planner/topology_switch.py) with plain values, the
decision's pools for an aggregated cluster, and the loop switching a cluster's topology against
a real Redis (the routers read what it publishes)."""

from __future__ import annotations

import json
import math
import uuid

import pytest
import redis as redis_lib
import redis.asyncio as aioredis

from pdserve.keys import planner_decision_key, router_load_key, topology_key
from pdserve.registry import Registry, WorkerRecord
from planner.decision import ObservedLoad, PlannerConfig, decide
from planner.online import LoopSettings, Oracle, PlannerLoop
from planner.pool_sizes import PoolSizes
from planner_testkit import RecordingActuator
from planner.topology_switch import bounds_for, check_kinds, choose_kind
from router.live_stats import LoadSummary

P = PoolSizes
ALL = ("disaggregated", "hybrid", "aggregated")


@pytest.mark.parametrize("current, plans, since_s, want, reason", [
    # ties and one-device gains below min_devices_saved=1 ... a tie keeps the current kind
    ("disaggregated", {"disaggregated": P(1, 1), "hybrid": P(1, 1), "aggregated": P(0, 2)}, 1e9, "disaggregated", ""),
    # the aggregated cluster needs one device fewer: switch
    ("disaggregated", {"disaggregated": P(1, 2), "hybrid": P(1, 2), "aggregated": P(0, 2)}, 1e9, "aggregated",
     "1 device(s) fewer"),
    # ... but not within the cooldown
    ("disaggregated", {"disaggregated": P(1, 2), "aggregated": P(0, 2)}, 10, "disaggregated", "switch cooldown"),
    # the current kind meets the SLOs at no size: any kind that does wins
    ("aggregated", {"disaggregated": P(2, 2), "hybrid": P(1, 3), "aggregated": None}, 1e9, "disaggregated",
     "meets the SLOs at no size"),
    # nothing meets the SLOs: stay
    ("hybrid", {"disaggregated": None, "hybrid": None, "aggregated": None}, 1e9, "hybrid", ""),
    # equal devices among the others: the operator's order (ALL) decides, here disaggregated before hybrid
    ("aggregated", {"disaggregated": P(1, 1), "hybrid": P(1, 1), "aggregated": P(0, 3)}, 1e9, "disaggregated",
     "1 device(s) fewer"),
    # no plans at all (an untrusted model): stay
    ("disaggregated", {}, 1e9, "disaggregated", ""),
])
def test_the_choice_switches_only_for_a_device_saved_or_the_slos_rescued(current, plans, since_s, want, reason):
    choice = choose_kind(current, plans, ALL, since_switch_s=since_s, cooldown_s=300)
    assert choice.kind == want and reason in choice.reason and bool(choice.reason) == bool(reason)


def test_a_kind_the_operator_no_longer_allows_is_left_at_once_cooldown_or_not():
    choice = choose_kind("disaggregated", {"aggregated": P(0, 3), "hybrid": P(1, 1)}, ("aggregated", "hybrid"),
                         since_switch_s=0, cooldown_s=300)
    assert choice.kind == "hybrid" and "not allowed" in choice.reason
    blind = choose_kind("disaggregated", {}, ("aggregated", "hybrid"), since_switch_s=0, cooldown_s=300)
    assert blind.kind == "aggregated" and "no allowed kind meets" in blind.reason


def test_a_bigger_saving_can_be_asked_for():
    plans = {"disaggregated": P(1, 2), "aggregated": P(0, 2)}
    assert choose_kind("disaggregated", plans, ALL, 1e9, 0, min_devices_saved=2).kind == "disaggregated"
    assert choose_kind("disaggregated", plans, ALL, 1e9, 0, min_devices_saved=1).kind == "aggregated"


def test_bounds_and_kinds():
    assert bounds_for("aggregated", P(1, 1), P(2, 3)) == (P(0, 1), P(0, 5))
    assert bounds_for("hybrid", P(1, 1), P(2, 3)) == (P(1, 1), P(2, 3))
    assert check_kinds(["hybrid", "aggregated"]) == ("hybrid", "aggregated")
    for bad in ([], ["hybrid", "hybrid"], ["colocated"]):
        with pytest.raises(ValueError, match="distinct kinds"):
            check_kinds(bad)
    with pytest.raises(ValueError, match="distinct kinds"):
        PlannerConfig(ttft_slo_s=1, tpot_slo_s=1, topologies=("disaggregated", "nope"))


def observed(current: PoolSizes, ttft_p90_s: float = 0.1) -> ObservedLoad:
    return ObservedLoad(arrival_rate_rps=4.0, mean_prompt_tokens=100, mean_output_tokens=50, ttft_p90_s=ttft_p90_s,
                        tpot_p90_s=0.01, current=current, seconds_since_last_scale=math.inf)


def test_an_aggregated_decision_has_no_prefill_pool_and_its_ttft_guard_grows_the_workers():
    config = PlannerConfig(ttft_slo_s=0.5, tpot_slo_s=0.1, max_sizes=P(2, 2))
    to_aggregated = decide(observed(P(1, 1)), config, lambda *_: P(0, 2), kind="aggregated")
    assert to_aggregated.target == P(0, 2)  # the prefill worker goes, the workers grow to the plan
    slow = decide(observed(P(0, 2), ttft_p90_s=0.9), config, lambda *_: P(0, 2), kind="aggregated")
    assert slow.target == P(0, 3) and any("decode: observed p90 TTFT" in r for r in slow.reasons)
    capped = decide(observed(P(0, 4), ttft_p90_s=0.9), config, lambda *_: P(0, 4), kind="aggregated")
    assert capped.target == P(0, 4)  # the budget is max_sizes' 4 devices
    assert decide(observed(P(1, 1), ttft_p90_s=0.9), config, lambda *_: P(1, 1)).target == P(2, 1)  # unchanged


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_loop_publishes_a_new_topology_before_it_resizes_and_starts_workers_before_draining(redis_server):
    cluster = f"t{uuid.uuid4().hex[:8]}"
    redis = aioredis.from_url(redis_server.url)
    registry = Registry(redis_server.url, cluster)
    try:
        for worker_id, role in (("p0", "prefill"), ("d0", "decode")):
            await registry.heartbeat(WorkerRecord(worker_id, role, "m", "127.0.0.1:1"), ttl_s=30)
        summary = LoadSummary("r1", 0.0, 10.0, 20, 2, 2.0, 100.0, 50.0, 0.1, 0.2, 0.01, 0.02)
        await redis.set(router_load_key(cluster, "r1"), summary.to_json(), px=30_000)
        plans = {"disaggregated": lambda *_: P(1, 2), "aggregated": lambda *_: P(0, 2)}  # aggregated saves one
        published_at_scale = []  # what the routers read when each pool moved
        sync_redis = redis_lib.Redis.from_url(redis_server.url)

        class Actuator(RecordingActuator):
            def scale(self, role: str, replicas: int) -> None:
                published_at_scale.append(sync_redis.get(topology_key(cluster)))
                super().scale(role, replicas)

        actuator = Actuator(1, 1)
        config = PlannerConfig(ttft_slo_s=1.0, tpot_slo_s=0.1, max_sizes=P(2, 2), predictor="last",
                               topologies=("disaggregated", "aggregated"), topology_cooldown_s=60)
        clock = Clock()
        loop = PlannerLoop(redis, registry, LoopSettings(cluster, interval_s=1.0), config,
                           Oracle(plans["disaggregated"], plans=plans), actuator, clock=clock)

        tick = await loop.tick()
        assert await redis.get(topology_key(cluster)) == b"aggregated"
        assert tick.topology == "aggregated" and "1 device(s) fewer" in tick.decision.reasons[0]
        assert actuator.calls == [("decode", 2), ("prefill", 0)]  # the new worker first, then the drain
        assert published_at_scale == [b"aggregated", b"aggregated"]  # the routers knew before any pool moved
        assert json.loads(await redis.get(planner_decision_key(cluster)))["topology"] == "aggregated"

        plans["aggregated"] = lambda *_: None  # the aggregated cluster can no longer meet the SLOs ...
        clock.now += 10
        held = await loop.tick()  # ... but the switch cooldown holds it
        assert held.topology == "aggregated" and "switch cooldown" in held.decision.reasons[0]
        clock.now += 60
        back = await loop.tick()
        assert back.topology == "disaggregated" and await redis.get(topology_key(cluster)) == b"disaggregated"
        assert actuator.sizes == {"prefill": 1, "decode": 2}
    finally:
        await registry.close()
        await redis.aclose()
