"""Live load at the router, for the online planner: a sliding window of finished requests,
summarized and published to Redis every interval.

    pdserve:{cluster}:load:router:{router_id}   JSON of `LoadSummary`; expires after `ttl_s`

Each finished request (the router's `Timings`) is recorded with its arrival time, prompt and
output tokens, TTFT and TPOT. The summary covers the last `window_s` seconds (less just after
start). Contract of the published numbers:
- `arrival_rate_rps` = (finished requests that arrived within the window + requests in flight now)
  / window: requests still running count as they arrive, so the rate rises at once under a load
  step instead of after the requests finish;
- TTFT and TPOT percentiles are over the requests finished in the window (TPOT as vLLM defines
  it, requests with more than one output token only); None when there are none;
- failed requests are not recorded (only successful completions reach `observe_finished`).
The key expires after `ttl_s`, so a router that stops publishing disappears from the planner's view.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields

from pdserve.keys import router_load_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveLoadConfig:
    window_s: float = 30.0
    interval_s: float = 2.0
    router_id: str = ""  # "" = <hostname>-<pid>

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and self.interval_s > 0):
            raise ValueError(f"live load window_s and interval_s must be > 0 seconds, got "
                             f"{self.window_s} and {self.interval_s} (PDSERVE_LOAD_WINDOW_S, PDSERVE_LOAD_INTERVAL_S)")

    @property
    def ttl_s(self) -> float:
        return 3 * self.interval_s

    @property
    def resolved_router_id(self) -> str:
        return self.router_id or f"{socket.gethostname()}-{os.getpid()}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "LiveLoadConfig":
        """PDSERVE_LOAD_WINDOW_S, PDSERVE_LOAD_INTERVAL_S and PDSERVE_ROUTER_ID, when set."""
        defaults = cls()
        return cls(window_s=float(env.get("PDSERVE_LOAD_WINDOW_S", defaults.window_s)),
                   interval_s=float(env.get("PDSERVE_LOAD_INTERVAL_S", defaults.interval_s)),
                   router_id=env.get("PDSERVE_ROUTER_ID", ""))


@dataclass(frozen=True)
class FinishedRequest:
    finished_at_s: float  # wall clock (time.time())
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float | None  # None for a single output token


@dataclass(frozen=True)
class LoadSummary:
    router_id: str
    published_at_s: float
    window_s: float  # the span the numbers cover
    num_finished: int
    num_inflight: int
    arrival_rate_rps: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "LoadSummary":
        data = json.loads(text)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


class LoadWindow:
    """Finished requests of the last `window_s` seconds. `record` is O(1); `summary` prunes."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self._clock = clock
        self._started_s = clock()
        self._finished: deque[FinishedRequest] = deque()

    def record(self, timings) -> None:
        """Called with the router's `Timings` of every successfully finished request."""
        now = self._clock()
        tpot = ((timings.e2e_s - timings.ttft_s) / (timings.output_tokens - 1)
                if timings.output_tokens > 1 else None)
        self._finished.append(FinishedRequest(now, now - timings.e2e_s, timings.prompt_tokens,
                                              timings.output_tokens, timings.ttft_s, tpot))

    def summary(self, router_id: str, num_inflight: int) -> LoadSummary:
        now = self._clock()
        start = now - self.window_s
        while self._finished and self._finished[0].finished_at_s < start:
            self._finished.popleft()
        span = min(self.window_s, max(now - self._started_s, 1e-3))
        done = list(self._finished)
        arrived = sum(1 for r in done if r.arrival_s >= now - span)
        ttfts = sorted(r.ttft_s for r in done)
        tpots = sorted(r.tpot_s for r in done if r.tpot_s is not None)
        count = len(done)
        return LoadSummary(
            router_id=router_id, published_at_s=now, window_s=span, num_finished=count, num_inflight=num_inflight,
            arrival_rate_rps=(arrived + num_inflight) / span,
            mean_prompt_tokens=sum(r.prompt_tokens for r in done) / count if count else 0.0,
            mean_output_tokens=sum(r.output_tokens for r in done) / count if count else 0.0,
            ttft_p50_s=percentile(ttfts, 50), ttft_p90_s=percentile(ttfts, 90),
            tpot_p50_s=percentile(tpots, 50), tpot_p90_s=percentile(tpots, 90),
        )


async def publish_forever(redis, cluster: str, config: LiveLoadConfig, window: LoadWindow,
                          inflight: Callable[[], int]) -> None:
    """Every `interval_s`: SET the summary with a TTL. Redis errors are logged, never fatal."""
    from redis.exceptions import RedisError

    key = router_load_key(cluster, config.resolved_router_id)
    while True:
        summary = window.summary(config.resolved_router_id, inflight())
        try:
            await redis.set(key, summary.to_json(), px=int(config.ttl_s * 1000))
        except (RedisError, OSError) as error:
            logger.warning("could not publish live load to %s: %s", key, error)
        await asyncio.sleep(config.interval_s)


def start_load_publisher(redis_url: str, cluster: str, inflight: Callable[[], int],
                         config: LiveLoadConfig | None = None) -> asyncio.Task:
    """Records every finished request (through `pdserve.metrics.FINISHED_OBSERVERS`) and publishes
    the window's summary until the returned task is cancelled."""
    from redis.exceptions import RedisError

    from pdserve import metrics
    from pdserve.registry import connect_redis

    config = config or LiveLoadConfig.from_env()
    window = LoadWindow(config.window_s)
    metrics.FINISHED_OBSERVERS.append(window.record)

    async def run() -> None:
        redis = connect_redis(redis_url)
        try:
            await publish_forever(redis, cluster, config, window, inflight)
        finally:
            metrics.FINISHED_OBSERVERS.remove(window.record)
            with contextlib.suppress(RedisError, OSError):  # the key expires on its own anyway
                await redis.delete(router_load_key(cluster, config.resolved_router_id))
            await redis.aclose()

    return asyncio.create_task(run(), name="pdserve-live-load")
