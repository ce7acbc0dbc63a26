"""Pick the least-loaded worker of a role.

Two signals, of different freshness:
- `router_inflight`: the requests this router has in flight there, exact and current;
- `reported_requests`: running + waiting as the worker last reported into the registry (up to a
  heartbeat, ~1 s, old). It includes other routers' requests, but also this router's requests of a
  second ago that may be long finished.

The score is this router's in-flight count plus a discounted share of whatever the worker reports
beyond it (other routers' work, or staleness). Taking the larger of the two instead let a stale
report of a burst steer every request of the next second to the other worker, and under a closed
loop that skew fed itself (seen: 38 of 38 requests on one of two decode workers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Candidate:
    worker_id: str
    reported_requests: int     # running + waiting, as last reported
    kv_usage: float            # KV blocks used / total, in [0, 1]
    router_inflight: int       # requests this router has in flight there


REPORTED_EXCESS_WEIGHT = 0.5  # how much of the reported load beyond our own in-flight we believe
KV_USAGE_WEIGHT = 4.0         # a full KV cache weighs as much as four requests


def load_score(candidate: Candidate) -> float:
    """Lower is better: requests dominate, KV pressure breaks ties (and matters near full)."""
    beyond_ours = max(0, candidate.reported_requests - candidate.router_inflight)
    return (candidate.router_inflight + REPORTED_EXCESS_WEIGHT * beyond_ours
            + KV_USAGE_WEIGHT * candidate.kv_usage)


def pick_least_loaded(candidates: Sequence[Candidate], exclude: frozenset[str] = frozenset()) -> Candidate | None:
    eligible = [c for c in candidates if c.worker_id not in exclude]
    if not eligible:
        return None
    return min(eligible, key=lambda c: (load_score(c), c.worker_id))
