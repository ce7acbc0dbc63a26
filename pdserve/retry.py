"""When the SDK sends a failed Generate again, and after how long: pure decisions on plain values.

A call is retried only when the router never answered it and nothing reached the caller
(`may_retry`). Retries are bounded by time, not by count: `RetryPolicy.budget_s` (30 s by default)
is how long after a call started a retry may still begin, which covers a router restart: ~6 s
from spawn to routing on an AMX 2-vCPU host, but 15-20 s on an AVX2-only one under load (the
router imports vLLM for its validation and detokenizer: 10-14 s there), plus the 2 s the chaos
run keeps it down. Between attempts the client waits an exponential backoff with jitter (0.25 s doubling to
2 s, each +-20%), so clients whose calls failed together do not come back together. A caller's own
`timeout_s` bounds everything: no retry starts that could not finish inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from pdserve.errors import ANSWERED_METADATA

DEFAULT_RETRY_BUDGET_S = 30.0
RETRY_BASE_DELAY_S = 0.25
RETRY_MAX_DELAY_S = 2.0
RETRY_JITTER = 0.2   # each delay is its nominal value times a uniform factor in [0.8, 1.2)


@dataclass(frozen=True)
class RetryPolicy:
    """`budget_s`: no retry begins later than this after the call started (0: never retry).
    `max_retries`: an optional count limit on top of the budget (None: the budget alone)."""

    budget_s: float = DEFAULT_RETRY_BUDGET_S
    max_retries: int | None = None
    base_delay_s: float = RETRY_BASE_DELAY_S
    max_delay_s: float = RETRY_MAX_DELAY_S

    def __post_init__(self):
        if self.budget_s < 0:
            raise ValueError(f"retry_budget_s must be >= 0 (0 turns retries off), got {self.budget_s}")
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"retries must be >= 0 or None (no count limit), got {self.max_retries}")
        if not 0 < self.base_delay_s <= self.max_delay_s:
            raise ValueError(f"need 0 < base_delay_s <= max_delay_s, got {self.base_delay_s} and {self.max_delay_s}")


def may_retry(code: grpc.StatusCode, trailing_keys: frozenset[str], chunks_received: int) -> bool:
    """Whether a failed Generate may be sent again: the router never answered it (UNAVAILABLE
    without the router's error metadata) and the caller has received nothing."""
    return code == grpc.StatusCode.UNAVAILABLE and ANSWERED_METADATA not in trailing_keys and chunks_received == 0


def retry_delay_s(attempt: int, jitter: float = 0.5, policy: RetryPolicy = RetryPolicy()) -> float:
    """Backoff before retry `attempt` (0-based). Nominally (`jitter` 0.5) 0.25, 0.5, 1, 2, 2, ...
    seconds; `jitter`, uniform in [0, 1), scales that by 0.8 to 1.2."""
    nominal_s = min(policy.max_delay_s, policy.base_delay_s * 2 ** min(attempt, 32))
    return nominal_s * (1.0 - RETRY_JITTER + 2 * RETRY_JITTER * jitter)


def next_retry_delay_s(policy: RetryPolicy, retries_done: int, elapsed_s: float, timeout_s: float | None,
                       jitter: float) -> float | None:
    """How long to wait before sending a retryable call again, or None to give up. `elapsed_s`
    is the time since the call first started; `timeout_s` the caller's deadline for all of it.

    The last retry is pulled in to begin at the budget's end rather than dropped, so a router
    back at second 14.9 still serves the call; a retry that would begin at or past the caller's
    deadline is never made."""
    if policy.max_retries is not None and retries_done >= policy.max_retries:
        return None
    budget_left_s = policy.budget_s - elapsed_s
    if budget_left_s <= 0:
        return None
    delay_s = min(retry_delay_s(retries_done, jitter, policy), budget_left_s)
    if timeout_s is not None and elapsed_s + delay_s >= timeout_s:
        return None
    return delay_s


def attempt_timeout_s(timeout_s: float | None, elapsed_s: float) -> float | None:
    """The gRPC timeout of the next attempt: what is left of the caller's deadline (None: none)."""
    return None if timeout_s is None else max(0.0, timeout_s - elapsed_s)
