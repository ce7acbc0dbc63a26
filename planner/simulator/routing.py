"""Routing in the simulator is the router's own code: `router.policies.least_loaded`.

The simulator knows every instance's state exactly, so a worker's reported requests and the
router's in-flight count are the same number: requests sent to the instance and not yet answered
(prefill: until the first token; decode and colocated: until the last token). KV usage is blocks
used / total (0 on prefill instances, whose KV is not modelled). Ties go to the lowest index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from router.policies.least_loaded import Candidate, load_score


class Routable(Protocol):
    index: int

    def in_flight(self) -> int: ...

    def kv_usage(self) -> float: ...


def pick(instances: Sequence[Routable]):
    """The instance the router would choose now."""
    def score(instance: Routable) -> tuple[float, int]:
        requests = instance.in_flight()
        candidate = Candidate(worker_id=str(instance.index), reported_requests=requests,
                              kv_usage=instance.kv_usage(), router_inflight=requests)
        return load_score(candidate), instance.index

    return min(instances, key=score)
