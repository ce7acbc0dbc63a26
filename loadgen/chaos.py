"""A chaos run's decisions, pure: what to break and when, and what the run's outcomes add up to
(`bench/chaos.py` does the I/O: the cluster, the traffic, the kills, the reference check).

Outcomes of one request, as a client sees it:
- completed: every token it asked for, finish reason given;
- failed_clean: a typed error (pdserve.errors.ServeError: UNAVAILABLE, ...) within its deadline;
- hung: no answer by its deadline (the request timeout plus a margin): the one outcome never allowed.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["sigkill_decode", "sigterm_decode", "sigkill_prefill", "kill_router", "kill_redis"]
ACTIONS: tuple[Action, ...] = ("sigkill_decode", "sigterm_decode", "sigkill_prefill", "kill_router", "kill_redis")
Outcome = Literal["completed", "failed_clean", "hung"]


@dataclass(frozen=True)
class ChaosEvent:
    at_s: float      # offset from the start of the run
    action: Action


def chaos_schedule(duration_s: float, every_s: float, seed: int = 0,
                   actions: tuple[Action, ...] = ACTIONS, quiet_tail_s: float = 30.0) -> list[ChaosEvent]:
    """One event every `every_s` seconds (jittered by up to a quarter of it) from `every_s` on,
    none in the last `quiet_tail_s` (the cluster must recover before the run ends), cycling
    through `actions` in a shuffled order so each is taken about equally often."""
    if every_s <= 0 or duration_s <= 0:
        raise ValueError(f"duration_s and every_s must be > 0 seconds, got {duration_s} and {every_s}")
    rng = random.Random(seed)
    events, order = [], []
    at_s = every_s
    while at_s < duration_s - quiet_tail_s:
        if not order:
            order = list(actions)
            rng.shuffle(order)
        events.append(ChaosEvent(round(at_s + rng.uniform(-0.25, 0.25) * every_s, 3), order.pop()))
        at_s += every_s
    return events


@dataclass(frozen=True)
class Victim:
    worker_id: str
    surge: bool      # start its replacement and wait for it to serve before the victim goes


def pick_victim(serving: list[str], doomed: set[str], min_serving: int, rng: random.Random) -> Victim | None:
    """Which serving worker of a pool an event takes, under a disruption budget of `min_serving`.

    `doomed` are victims already chosen whose replacements are still starting: they are not chosen
    twice, and they do not count towards the budget. When taking one more would leave fewer than
    `min_serving` serving, the victim goes only once its replacement serves (a surge, as a
    Kubernetes rollout with maxUnavailable 0 or a PodDisruptionBudget keeps a pool). None: no
    candidate (every serving worker is already doomed), so the event is skipped."""
    candidates = sorted(w for w in serving if w not in doomed)
    if not candidates:
        return None
    return Victim(rng.choice(candidates), surge=len(candidates) - 1 < min_serving)


@dataclass
class ChaosReport:
    """What a run adds up to. `in_flight_on_router_kill` requests are excluded from the completion
    aim: a client whose stream was on the router that died cannot get the rest of it."""

    outcomes: Counter = field(default_factory=Counter)
    in_flight_on_router_kill: int = 0
    checked: int = 0                 # requests compared with the colocated reference
    wrong: int = 0                   # of those, with other tokens
    leaked_kv_blocks: int = 0        # in use on some worker once the run is idle
    held_leases: int = 0             # KV held for a consumer once the run is idle
    workers_missing: int = 0         # not back in the registry at the end
    events: list[ChaosEvent] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)   # events with no victim (every serving worker was going)
    surged: list[str] = field(default_factory=list)    # events whose victim went once its replacement served
    settle_error: str = ""           # why what was left could not be counted ("": it was)

    def record(self, outcome: Outcome) -> None:
        self.outcomes[outcome] += 1

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    @property
    def completed_share(self) -> float:
        """Completed among the requests that were not in flight on a killed router."""
        eligible = self.sent - self.in_flight_on_router_kill
        return self.outcomes["completed"] / eligible if eligible > 0 else 1.0

    def shortfalls(self) -> list[str]:
        """Each aim the run missed, in words; empty when it met them all."""
        misses = []
        if self.outcomes["hung"]:
            misses.append(f"{self.outcomes['hung']} hung")
        if self.completed_share < 0.99:
            misses.append(f"completed {self.completed_share:.1%} < 99%")
        if self.wrong:
            misses.append(f"{self.wrong} of {self.checked} checked had wrong tokens")
        if self.leaked_kv_blocks or self.held_leases:
            misses.append(f"{self.leaked_kv_blocks} KV blocks and {self.held_leases} leases left")
        if self.workers_missing:
            misses.append(f"{self.workers_missing} workers not back in the registry")
        if self.settle_error:
            misses.append(f"what was left could not be counted: {self.settle_error}")
        return misses
