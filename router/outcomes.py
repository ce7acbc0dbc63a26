"""How a request ended, as `pdserve_requests_total` counts it: a pure decision over what the API
edge saw (nothing, or the exception that ended the request).

Every request an API edge receives is counted exactly once, whether it was served or not:

    outcome    code  when
    ok         200   served to its last token
    refused    429   refused for load (admission control, the router's in-flight limit)
    cancelled  499   the client went away or aborted it
    failed     4xx/5xx  anything else: bad input (400), no healthy worker (503), the request's
                     deadline (504), a bug (500)

`code` is the HTTP status from `pdserve.errors`' one table, for gRPC requests too (the gRPC
status maps to it one to one), so one label serves dashboards of both APIs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from pdserve import metrics
from pdserve.errors import Cancelled, Overloaded, ServeError, http_status

Outcome = Literal["ok", "failed", "refused", "cancelled"]


@dataclass(frozen=True)
class RequestOutcome:
    outcome: Outcome
    code: int  # HTTP status


OK = RequestOutcome("ok", 200)
CANCELLED = RequestOutcome("cancelled", 499)
INTERNAL = RequestOutcome("failed", 500)
DUPLICATE_ID = RequestOutcome("failed", 409)  # gRPC ALREADY_EXISTS: the request id is running already


def count(api: str, ended: RequestOutcome) -> None:
    """Counts one request that ended as `ended` at API edge `api` in `pdserve_requests_total`."""
    metrics.count_request(api, ended.outcome, ended.code)


def outcome_of(error: BaseException | None) -> RequestOutcome:
    """The outcome of a request that ended with `error` (None: served)."""
    if error is None:
        return OK
    if isinstance(error, (asyncio.CancelledError, GeneratorExit, Cancelled)):
        return CANCELLED
    if isinstance(error, Overloaded):
        return RequestOutcome("refused", http_status(error))
    if isinstance(error, ServeError):
        return RequestOutcome("failed", http_status(error))
    return INTERNAL
