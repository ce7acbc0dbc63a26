"""What a worker's failed RPC means for the request and for the worker: a pure decision.

The lifecycle (router/lifecycle.py) asks `verdict_for(code)` for every status a worker answers
with, and acts on the answer; nothing here does I/O, so the rules are tested with plain values.

- The request's own fault (bad input, its deadline passed): the request ends with
  that error, nothing is retried, and the worker is *not* charged: a client must never be able to
  take a worker out of rotation by sending bad fields (issue 18 item 6).
- The worker is busy (RESOURCE_EXHAUSTED): try another worker; the worker is healthy.
- Anything else (UNAVAILABLE: down or unreachable; UNKNOWN/INTERNAL: it crashed or its engine
  died mid-call; CANCELLED: it was stopping): the worker's fault. Quarantine it and retry the
  phase elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

# DEADLINE_EXCEEDED: the request's own deadline (request_timeout_s) passed; retrying cannot help.
# CANCELLED is not here: a client's cancel ends the walk in the router itself (the task is
# cancelled); a worker answering CANCELLED was stopping (its drain's grace ended), so the phase
# is retried elsewhere, a decode resumed from the tokens already sent.
CLIENT_ERRORS = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
})
BUSY_ERRORS = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})


@dataclass(frozen=True)
class Verdict:
    end_request: bool   # the error is the client's: raise it to the client, try nothing else
    quarantine: bool    # the worker is at fault: route nothing to it for a while

    @property
    def retry_elsewhere(self) -> bool:
        return not self.end_request


def verdict_for(code: grpc.StatusCode) -> Verdict:
    if code in CLIENT_ERRORS:
        return Verdict(end_request=True, quarantine=False)
    if code in BUSY_ERRORS:
        return Verdict(end_request=False, quarantine=False)
    return Verdict(end_request=False, quarantine=True)
