"""The online SLA planner's loop: read live load -> `decide` -> actuator, every interval.

One tick:
1. read every router's live-load summary and the worker registry from Redis (`planner.live`);
   no router published: hold (missing data is not "no load") and say so;
2. ask the actuator for the pools' desired sizes (`current`), build `ObservedLoad`;
2b. with a latency model (`Oracle.latency`), judge it (`planner.model_error`): its p50/p90 TTFT and
   TPOT for the load observed this interval at the replicas that served it, against the observed
   ones; the correction it learns goes into `decide`. The numbers are published with the tick and
   as `pdserve_planner_*` gauges (`pdserve.metrics`);
2c. with more than one topology allowed (`PlannerConfig.topologies`), or the current one not
   allowed, plan each allowed kind at the predicted load and choose one
   (`planner.topology_switch.choose_kind`: a switch must save a device or rescue the SLOs, and
   waits out `topology_cooldown_s`); a new kind is published for every router
   (`pdserve.keys.topology_key`) before the pools are resized for it. The current kind is the one
   published, else `LoopSettings.topology` (what the cluster was started as);
3. `planner.decision.decide` (pure; it runs the simulator-backed search in a thread). While the
   gate refuses the model (its recent error is beyond `ErrorConfig.max_error`, or too few intervals
   were judged), its plan is not followed: `decide` is given `keep_sizes` instead, so no pool moves
   on the model's word; what is observed still moves one (a p90 over its SLO: the reactive guard;
   no traffic at all: toward the minimum), and the bounds still apply. The tick's note says why;
4. apply a changed target, one `actuator.scale(role, n)` per changed pool, growing pools first
   (make before break: a topology switch starts the new workers before it drains the old);
5. publish the decision for observability:
       pdserve:{cluster}:planner:decision    JSON of the last tick (SET, expires after 10 intervals)
       pdserve:{cluster}:planner:decisions   the last 100 ticks, newest first (LPUSH + LTRIM)

Actuator and Redis errors are logged and published, never fatal: the next tick tries again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from redis.exceptions import RedisError

from pdserve import metrics
from pdserve.keys import planner_decision_key, planner_decisions_key
from pdserve.registry import Registry, connect_redis
from planner.actuators.base import ROLES, Actuator
from pdserve.roles import TOPOLOGIES
from pdserve.roles import Topology as TopologyKind
from planner.decision import Decision, ObservedLoad, PlanFn, PlannerConfig, PredictFn, SloScale, decide, predict_rate
from planner.live import (LiveLoad, merge_loads, observation_window_s, observed_latencies, observed_load,
                          read_router_loads, ready_sizes)
from planner.model_error import ErrorConfig, LatencyFn, ModelErrorTracker, Verdict, may_act
from planner.pool_sizes import PoolSizes
from planner.topology_switch import KindChoice, choose_kind

logger = logging.getLogger(__name__)
HISTORY_LENGTH = 100
MODEL_NOT_TRUSTED = "model not trusted, its plan not followed"


@dataclass(frozen=True)
class LoopSettings:
    cluster: str
    interval_s: float = 10.0
    fallback_prompt_tokens: float = 512.0  # lengths assumed before any request finished
    fallback_output_tokens: float = 128.0
    dry_run: bool = False  # decide and publish, never call `actuator.scale` nor switch the topology
    topology: TopologyKind = "disaggregated"  # what the cluster was started as (until one is published)
    model_error: ErrorConfig = ErrorConfig()  # the gate on the model's recent error (step 2b)

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {self.interval_s}")


@dataclass(frozen=True)
class Oracle:
    """The performance model as the decision core asks it: `plan` sizes a load, `predict` says what
    latency the model expects at given sizes (None: no model correction). `latency` says the same as
    p50s and p90s; with it the loop judges the model every interval (step 2b) and its tracked
    correction replaces `predict`'s; without it nothing is judged and the gate never refuses.
    `fit` is for display."""

    plan: PlanFn
    predict: PredictFn | None = None
    fit: object | None = None
    latency: LatencyFn | None = None
    plans: Mapping[TopologyKind, PlanFn] | None = None  # per topology kind (step 2c); None: `plan` for every kind


@dataclass(frozen=True)
class Tick:
    """What one tick saw and did; `decision` is None when it held for lack of data."""

    at_s: float  # wall clock
    observed: ObservedLoad | None
    decision: Decision | None
    applied: bool
    note: str = ""
    errors: tuple[str, ...] = field(default=())
    model: dict | None = None  # `ModelErrorTracker.as_dict()` after this interval; None: not judged
    topology: TopologyKind | None = None  # the kind the pools were sized for; None: held before deciding

    def to_json(self) -> str:
        body = {"at_s": self.at_s, "applied": self.applied, "note": self.note, "errors": list(self.errors)}
        if self.observed is not None:
            observed = asdict(self.observed)
            if math.isinf(observed["seconds_since_last_scale"]):
                observed["seconds_since_last_scale"] = None  # never scaled (JSON has no infinity)
            body["observed"] = observed
        if self.decision is not None:
            d = self.decision
            body |= {"current": d.current.as_dict(), "target": d.target.as_dict(), "changed": d.changed,
                     "predicted_rate_rps": d.predicted_rate_rps, "reasons": list(d.reasons)}
        if self.model is not None:
            body["model"] = self.model
        if self.topology is not None:
            body["topology"] = self.topology
        return json.dumps(body)


class PlannerLoop:
    """Owns the loop's memory (rate history, last scale time, last lengths, the model's error); the
    rest is stateless."""

    def __init__(self, redis, registry: Registry, settings: LoopSettings, config: PlannerConfig, oracle: Oracle,
                 actuator: Actuator, clock: Callable[[], float] = time.monotonic) -> None:
        self.redis, self.registry, self.settings, self.config = redis, registry, settings, config
        self.oracle, self.actuator, self.clock = oracle, actuator, clock
        self._rates: deque[float] = deque(maxlen=max(1, config.window - 1))
        self._last_scale_s: float | None = None
        self._last_ready: PoolSizes | None = None
        self._lengths = (settings.fallback_prompt_tokens, settings.fallback_output_tokens)
        self._ready_changed_s = -math.inf  # when the serving pools last changed (before the first tick: never)
        self.model = ModelErrorTracker(settings.model_error) if oracle.latency is not None else None
        self._switched_s = -math.inf  # the last topology switch (before the first tick: never)
        self.ticks: deque[Tick] = deque(maxlen=HISTORY_LENGTH)  # the latest, for callers and tests

    @classmethod
    def connect(cls, redis_url: str, settings: LoopSettings, config: PlannerConfig, oracle: Oracle,
                actuator: Actuator) -> "PlannerLoop":
        return cls(connect_redis(redis_url), Registry(redis_url, settings.cluster), settings, config, oracle,
                   actuator)

    async def close(self) -> None:
        await self.registry.close()
        await self.redis.aclose()

    async def tick(self) -> Tick:
        errors: list[str] = []
        loads = await read_router_loads(self.redis, self.settings.cluster)
        live = merge_loads(loads)
        if live is None:
            return await self._finish(Tick(time.time(), None, None, False, "held: no router published live load"))
        if live.mean_prompt_tokens is not None:
            self._lengths = (live.mean_prompt_tokens, live.mean_output_tokens)
        try:
            current = PoolSizes.from_mapping(await asyncio.to_thread(self.actuator.current))
        except (RuntimeError, OSError) as error:  # the actuator's typed errors say what to fix
            return await self._finish(Tick(time.time(), None, None, False, f"held: actuator unavailable: {error}"))
        ready = ready_sizes(await self.registry.workers())
        self._note_new_replicas(ready)
        since_s = math.inf if self._last_scale_s is None else self.clock() - self._last_scale_s
        observed = observed_load(live, current, ready, since_s, tuple(self._rates), self._lengths)
        self._rates.append(live.arrival_rate_rps)
        verdict = await self._judge_model(live, observed, observation_window_s(loads))
        trusted = verdict is None or verdict.allowed
        predict, scale = (None, self.model.slo_scale()) if self.model is not None else (self.oracle.predict, None)
        current_kind = await self._current_kind()
        choice = await asyncio.to_thread(self._choose_kind, observed, current_kind, trusted, scale or SloScale())
        plan = self._plan_of(choice.kind) if trusted else keep_sizes(current)
        decision = await asyncio.to_thread(decide, observed, self.config, plan, predict, scale, choice.kind)
        if choice.reason:
            decision = replace(decision, reasons=(choice.reason, *decision.reasons))
        note = "" if trusted else f"{MODEL_NOT_TRUSTED}: {verdict.reason}"
        if note:
            logger.warning("planner: %s", note)
        if self.settings.dry_run:
            return await self._finish(self._tick(observed, decision, False, "; ".join(
                filter(None, ("dry run: not applied", note))), kind=choice.kind))
        if choice.kind != current_kind:
            await self._switch(choice.kind, errors)
        applied = decision.changed and await self._apply(decision, errors)
        return await self._finish(self._tick(observed, decision, applied, note, tuple(errors), choice.kind))

    def _tick(self, observed: ObservedLoad, decision: Decision, applied: bool, note: str = "",
              errors: tuple[str, ...] = (), kind: TopologyKind | None = None) -> Tick:
        model = None if self.model is None else self.model.as_dict()
        return Tick(time.time(), observed, decision, applied, note, errors, model, kind)

    async def _current_kind(self) -> TopologyKind:
        """The topology the routers place for: the one published for the cluster, else the one it was started as."""
        published = await self.registry.topology()
        return published if published in TOPOLOGIES else self.settings.topology  # type: ignore[return-value]

    def _plan_of(self, kind: TopologyKind) -> PlanFn:
        plans = self.oracle.plans
        if plans is None:
            return self.oracle.plan
        if kind not in plans:
            raise ValueError(f"the oracle has no plan for the {kind} topology; it plans {sorted(plans)}")
        return plans[kind]

    def _choose_kind(self, observed: ObservedLoad, current: TopologyKind, trusted: bool, scale: SloScale) -> KindChoice:
        """Step 2c. Each allowed kind is planned only when a switch is possible (several kinds, or
        the current one not allowed) and the model is trusted (an untrusted model moves no pool)."""
        allowed = self.config.topologies
        if allowed == (current,):
            return KindChoice(current, "")
        plans: dict[TopologyKind, PoolSizes | None] = {}
        if trusted:
            rate = predict_rate(observed.rate_history_rps + (observed.arrival_rate_rps,), self.config.predictor,
                                self.config.window)
            if rate > 0:
                plans = {kind: self._plan_of(kind)(rate, observed.mean_prompt_tokens, observed.mean_output_tokens,
                                                   scale) for kind in allowed}
        return choose_kind(current, plans, allowed, self.clock() - self._switched_s, self.config.topology_cooldown_s)

    async def _switch(self, kind: TopologyKind, errors: list[str]) -> None:
        """Publishes `kind` for every router (before any pool moves for it)."""
        try:
            await self.registry.set_topology(kind)
            self._switched_s = self.clock()
            logger.info("planner: topology switched to %s", kind)
        except (RedisError, OSError) as error:
            errors.append(f"publish topology {kind}: {error}")
            logger.error("planner: %s", errors[-1])

    async def _judge_model(self, live: LiveLoad, observed: ObservedLoad, window_s: float) -> Verdict | None:
        """Step 2b: records this interval's predicted against observed latency and returns the gate's
        verdict (None without a latency model). The interval is not scored while the routers' window
        (`window_s`) still holds requests served before the serving pools last changed."""
        if self.model is None:
            return None
        serving = observed.ready if observed.ready is not None else observed.current
        raw = None
        if serving.prefill >= 1 and serving.decode >= 1 and observed.arrival_rate_rps > 0:
            raw = await asyncio.to_thread(self.oracle.latency, serving, observed.arrival_rate_rps,
                                          observed.mean_prompt_tokens, observed.mean_output_tokens)
        age_s = self.clock() - self._ready_changed_s
        incomparable = (f"the serving pools changed {age_s:.0f} s ago, within the routers' {window_s:.0f} s window"
                        if age_s < window_s else "")
        self.model = self.model.record(raw, observed_latencies(live), live.num_finished, incomparable)
        verdict = may_act(self.model)
        publish_model_gauges(self.model, verdict)
        return verdict

    def _note_new_replicas(self, ready: PoolSizes) -> None:
        """Restarts the cooldown clock when a pool gains serving replicas after a scale-up.

        The cooldown exists to judge a change by its effect; a replica that took minutes to boot has
        had no effect until it serves, so a cooldown counted from the decision alone could shrink the
        pool the moment the new replica arrives. A pool that loses replicas (a crash) does not restart
        the clock: its replacement must not wait. Any change is noted for step 2b: latencies observed
        before it describe other pools."""
        previous, self._last_ready = self._last_ready, ready
        if previous is not None and ready != previous:
            self._ready_changed_s = self.clock()
        if self._last_scale_s is not None and previous is not None and any(
                ready.of(role) > previous.of(role) for role in ROLES):
            self._last_scale_s = self.clock()

    async def _apply(self, decision: Decision, errors: list[str]) -> bool:
        applied = False
        growing_first = sorted(ROLES, key=lambda role: decision.target.of(role) <= decision.current.of(role))
        for role in growing_first:
            if decision.target.of(role) == decision.current.of(role):
                continue
            try:
                await asyncio.to_thread(self.actuator.scale, role, decision.target.of(role))
                applied = True
            except (RuntimeError, ValueError, OSError) as error:  # the actuator's typed errors say what to fix
                errors.append(f"scale {role} to {decision.target.of(role)}: {error}")
                logger.error("planner: %s", errors[-1])
        if applied:
            self._last_scale_s = self.clock()
        return applied

    async def _finish(self, tick: Tick) -> Tick:
        self.ticks.append(tick)
        payload = tick.to_json()
        try:
            ttl_ms = int(10 * self.settings.interval_s * 1000)
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(planner_decision_key(self.settings.cluster), payload, px=ttl_ms)
                pipe.lpush(planner_decisions_key(self.settings.cluster), payload)
                pipe.ltrim(planner_decisions_key(self.settings.cluster), 0, HISTORY_LENGTH - 1)
                await pipe.execute()
        except (RedisError, OSError) as error:
            logger.warning("planner: could not publish the decision: %s", error)
        return tick

    async def run(self, stop: asyncio.Event, on_tick: Callable[[Tick], None] | None = None) -> None:
        """Tick every `interval_s` (measured start to start) until `stop` is set."""
        while not stop.is_set():
            started = self.clock()
            try:
                tick = await self.tick()
                if on_tick is not None:
                    on_tick(tick)
            except (RedisError, OSError) as error:
                logger.warning("planner: tick failed, retrying next interval: %s", error)
            remaining = self.settings.interval_s - (self.clock() - started)
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, remaining))
            except TimeoutError:
                pass


def keep_sizes(current: PoolSizes) -> PlanFn:
    """The plan of a model the gate refuses: the current sizes, whatever the load. `decide` then
    neither grows nor shrinks a pool on the model's word (no simulation runs either)."""
    return lambda rate_rps, mean_prompt_tokens, mean_output_tokens, slo_scale: current


def publish_model_gauges(tracker: ModelErrorTracker, verdict: Verdict) -> None:
    """Sets the `pdserve_planner_*` gauges (`pdserve.metrics`) from the tracker; NaN where unknown."""
    gauges = {"predicted_s": metrics.PLANNER_PREDICTED_S, "observed_s": metrics.PLANNER_OBSERVED_S,
              "error": metrics.PLANNER_ERROR, "recent_error": metrics.PLANNER_RECENT_ERROR,
              "correction": metrics.PLANNER_CORRECTION}
    for metric, numbers in tracker.as_dict()["metrics"].items():
        for key, family in gauges.items():
            family[metric].set(math.nan if numbers[key] is None else numbers[key])
    metrics.PLANNER_MODEL_TRUSTED.set(int(verdict.allowed))
