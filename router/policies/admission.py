"""Admission: take a request now, or refuse it with when to come back. Pure.

Contract of `admit(best, request, config)`:
- `best` is the placement's prediction for the request (`placement.place(...).prediction`), or
  None when no path can take it at all;
- no path: `Refuse(min_retry_after_s, ...)`;
- the best predicted TTFT above ttft_slo * (1 + refuse_slack): `Refuse` with
  retry_after_s = max(min_retry_after_s, ceil(ttft_s - ttft_slo_s)): the predicted time for the
  queues ahead of it to drain until it would meet its SLO, in whole seconds (HTTP Retry-After);
- otherwise `Admit()` (a request between the SLO and the refuse line is admitted late: refusing it
  would only make the client wait longer).
The edge maps `Refuse` to RESOURCE_EXHAUSTED / HTTP 429 with Retry-After.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.policies.placement.config import PlacementConfig
from router.policies.placement.paths import Prediction
from router.policies.placement.state import RequestView

_FLOAT_NOISE_S = 1e-9   # so 2.0000000001 s of drain is 2 s, not 3


@dataclass(frozen=True)
class Admit:
    pass


@dataclass(frozen=True)
class Refuse:
    retry_after_s: float
    reason: str


def admit(best: Prediction | None, request: RequestView, config: PlacementConfig) -> Admit | Refuse:
    if best is None:
        return Refuse(config.min_retry_after_s, "no worker can take the request now (no decode worker, or none "
                                                "with free KV blocks for its prompt and max_tokens)")
    limit_s = request.ttft_slo_s * (1.0 + config.refuse_slack)
    if best.ttft_s <= limit_s:
        return Admit()
    drain_s = math.ceil(best.ttft_s - request.ttft_slo_s - _FLOAT_NOISE_S)
    return Refuse(max(config.min_retry_after_s, float(drain_s)),
                  f"predicted time to first token {best.ttft_s:.2f} s exceeds the limit of {limit_s:.2f} s "
                  f"(SLO {request.ttft_slo_s:.2f} s x {1.0 + config.refuse_slack:g})")
