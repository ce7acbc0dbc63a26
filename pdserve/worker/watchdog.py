"""Health that tells the truth: a worker whose vLLM engine died says so, leaves, and exits.

A worker learns that its engine core process died in two ways, both vLLM's own (0.32):
- `AsyncLLM.errored` turns True: vLLM's monitor thread waits on the engine core process and marks
  the client dead when it exits unexpectedly (within about a second), or the output loop ended;
- a call into the engine raises `EngineDeadError` (every request in flight, and every new one).

vLLM never restarts a dead engine core inside the process, so the worker can only make room for
a fresh one. `judge` decides (pure: an observation in, a verdict out); `EngineWatchdog` observes
and wakes on either sign; `leave` carries the verdict's steps out, in this order:

1. `not_serving`: gRPC health answers NOT_SERVING (Kubernetes probes, `grpc_health_probe`);
2. `stop_heartbeat`: no beat may re-register the worker after the next step;
3. `deregister`: the registry entry is deleted, so routers stop picking this worker at their next
   refresh instead of after the lease's `ttl_s`;
then the process exits with `ENGINE_DEAD_EXIT_CODE`, never 0, so its supervisor starts a new worker
(a Ray member actor exits when its process does and Ray restarts it; Kubernetes restarts the
container). The local launcher (`launch.local.LocalCluster`) does not restart workers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

from redis.exceptions import RedisError

logger = logging.getLogger("pdserve.worker")

ENGINE_DEAD_EXIT_CODE = 69  # sysexits.h EX_UNAVAILABLE: the service this process exists for is gone
Step = Literal["not_serving", "stop_heartbeat", "deregister"]
LEAVE_STEPS: tuple[Step, ...] = ("not_serving", "stop_heartbeat", "deregister")


@dataclass(frozen=True)
class EngineObservation:
    """What the worker knows of its engine at one moment."""

    errored: bool                  # `AsyncLLM.errored`
    dead_error_seen: bool = False  # some call into the engine raised `EngineDeadError`


@dataclass(frozen=True)
class HealthVerdict:
    """Invariant: `serving` iff `steps` is empty iff `exit_code` is None."""

    serving: bool
    steps: tuple[Step, ...] = ()
    exit_code: int | None = None
    reason: str = ""


SERVING = HealthVerdict(serving=True)


def judge(observation: EngineObservation) -> HealthVerdict:
    """SERVING while the engine lives; otherwise every step of `LEAVE_STEPS`, then a non-zero exit.
    Either sign alone is enough: a dead engine does not come back."""
    if observation.errored:
        reason = "vLLM reports its engine core dead (AsyncLLM.errored)"
    elif observation.dead_error_seen:
        reason = "a request failed with vLLM's EngineDeadError"
    else:
        return SERVING
    return HealthVerdict(serving=False, steps=LEAVE_STEPS, exit_code=ENGINE_DEAD_EXIT_CODE, reason=reason)


def is_engine_dead_error(error: BaseException) -> bool:
    """True for vLLM's `EngineDeadError` (the engine core is gone; no request can succeed here)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(error, EngineDeadError)


class EngineWatchdog:
    """Watches one `AsyncLLM` (anything with an `errored` property). `report(error)` is called by
    the RPC handlers with what the engine raised; `wait_dead()` returns the first verdict that is
    not SERVING, at most `interval_s` after `errored` turns True, at once after a reported
    `EngineDeadError`."""

    def __init__(self, engine, interval_s: float = 0.5):
        self.engine, self.interval_s = engine, interval_s
        self._dead_error_seen = False
        self._wake = asyncio.Event()

    def observe(self) -> EngineObservation:
        return EngineObservation(errored=bool(self.engine.errored), dead_error_seen=self._dead_error_seen)

    def report(self, error: BaseException) -> bool:
        """True (and the watchdog woken) if `error` says the engine is dead."""
        if not is_engine_dead_error(error):
            return False
        self._dead_error_seen = True
        self._wake.set()
        return True

    async def wait_dead(self) -> HealthVerdict:
        while (verdict := judge(self.observe())).serving:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass
        return verdict


async def leave(verdict: HealthVerdict, *, health, heartbeat_stop: asyncio.Event, heartbeat: asyncio.Task,
                registry, worker_id: str) -> int:
    """Carries out `verdict.steps` in order (`health` a grpc.aio HealthServicer, `heartbeat` the
    lease loop that ends when `heartbeat_stop` is set); returns the exit code. A Redis error leaves
    the entry to lapse on its own (`ttl_s`); it never stops the exit."""
    logger.error("worker %s: %s; leaving and exiting with %s", worker_id, verdict.reason, verdict.exit_code)
    for step in verdict.steps:
        if step == "not_serving":
            await health.enter_graceful_shutdown()  # every service NOT_SERVING, and it stays so
        elif step == "stop_heartbeat":
            heartbeat_stop.set()
            await heartbeat
        elif step == "deregister":
            try:
                await registry.deregister(worker_id)
            except (RedisError, OSError) as error:
                logger.warning("could not leave the registry (%s); the lease lapses on its own", error)
    return verdict.exit_code if verdict.exit_code is not None else 0
