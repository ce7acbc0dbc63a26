"""Pick the least-loaded worker of a role.

Load is what the worker last reported (running + waiting requests, KV blocks in use) plus what this
router has sent it since (in-flight here), so a burst between two registry refreshes spreads out
instead of piling onto the worker that looked idle a moment ago.
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


def load_score(candidate: Candidate) -> float:
    """Lower is better: requests dominate, KV pressure breaks ties (and matters near full)."""
    return max(candidate.reported_requests, candidate.router_inflight) + 4.0 * candidate.kv_usage


def pick_least_loaded(candidates: Sequence[Candidate], exclude: frozenset[str] = frozenset()) -> Candidate | None:
    eligible = [c for c in candidates if c.worker_id not in exclude]
    if not eligible:
        return None
    return min(eligible, key=lambda c: (load_score(c), c.worker_id))
