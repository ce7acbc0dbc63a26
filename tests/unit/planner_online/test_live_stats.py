"""The router's live-load window and its publication to Redis (router/live_stats.py)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import redis.asyncio as aioredis

from pdserve import metrics
from pdserve.timings import Timings
from pdserve.keys import router_load_key
from router.live_stats import LiveLoadConfig, LoadSummary, LoadWindow, percentile, start_load_publisher


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def finished(ttft_s: float, e2e_s: float, prompt: int, output: int) -> Timings:
    return Timings(ttft_s=ttft_s, e2e_s=e2e_s, prompt_tokens=prompt, output_tokens=output)


def test_summary_of_a_window_counts_rates_lengths_and_percentiles():
    clock = Clock()
    window = LoadWindow(window_s=10.0, clock=clock)
    clock.now += 20  # the window is full: rates divide by 10 s
    for ttft, e2e, prompt, output in [(0.1, 1.1, 100, 11), (0.2, 2.2, 300, 21), (0.3, 0.3, 200, 1)]:
        window.record(finished(ttft, e2e, prompt, output))
    summary = window.summary("r1", num_inflight=2)
    assert summary.num_finished == 3 and summary.num_inflight == 2 and summary.window_s == 10.0
    assert summary.arrival_rate_rps == pytest.approx((3 + 2) / 10.0)  # finished + in flight
    assert summary.mean_prompt_tokens == 200.0 and summary.mean_output_tokens == 11.0
    assert summary.ttft_p50_s == pytest.approx(0.2) and summary.ttft_p90_s == pytest.approx(0.28)
    # TPOT = (e2e - ttft) / (output - 1): 0.1 and 0.1; the one-token request has none
    assert summary.tpot_p50_s == pytest.approx(0.1) and summary.tpot_p90_s == pytest.approx(0.1)


def test_old_requests_leave_the_window_and_early_arrivals_do_not_count_as_rate():
    clock = Clock()
    window = LoadWindow(window_s=10.0, clock=clock)
    clock.now += 30
    window.record(finished(0.1, 1.0, 10, 5))  # finished at 1030
    clock.now += 5
    window.record(finished(0.1, 12.0, 10, 5))  # finished at 1035, arrived at 1023: before the window
    clock.now += 6  # 1041: the first one (1030) is out of the window
    summary = window.summary("r1", num_inflight=0)
    assert summary.num_finished == 1
    assert summary.arrival_rate_rps == 0.0  # it arrived 18 s ago, before the 10 s window


def test_an_empty_window_has_no_percentiles_and_a_young_window_divides_by_its_age():
    clock = Clock()
    window = LoadWindow(window_s=30.0, clock=clock)
    clock.now += 4
    summary = window.summary("r1", num_inflight=2)
    assert summary.num_finished == 0 and summary.ttft_p90_s is None and summary.tpot_p50_s is None
    assert summary.window_s == 4.0 and summary.arrival_rate_rps == 0.5


def test_percentile_matches_numpy():
    values = sorted([0.3, 0.1, 0.9, 0.5, 0.2, 0.8, 0.4])
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None


def test_summary_json_round_trips_and_ignores_unknown_fields():
    summary = LoadSummary("r", 1.0, 10.0, 3, 1, 0.4, 100.0, 10.0, 0.1, 0.2, 0.01, 0.02)
    assert LoadSummary.from_json(summary.to_json()) == summary
    assert LoadSummary.from_json(json.dumps(json.loads(summary.to_json()) | {"future": 1})) == summary


def test_config_from_env_and_its_validation():
    config = LiveLoadConfig.from_env({"PDSERVE_LOAD_WINDOW_S": "5", "PDSERVE_LOAD_INTERVAL_S": "0.5",
                                      "PDSERVE_ROUTER_ID": "edge-1"})
    assert (config.window_s, config.interval_s, config.ttl_s, config.resolved_router_id) == (5.0, 0.5, 1.5, "edge-1")
    with pytest.raises(ValueError, match="PDSERVE_LOAD_WINDOW_S"):
        LiveLoadConfig(window_s=0)


async def test_publisher_records_finished_requests_and_publishes_with_a_ttl(redis_server):
    config = LiveLoadConfig(window_s=10.0, interval_s=0.05, router_id="router-a")
    task = start_load_publisher(redis_server.url, "livetest", lambda: 4, config)
    redis = aioredis.from_url(redis_server.url)
    key = router_load_key("livetest", "router-a")
    try:
        await asyncio.sleep(0.01)
        metrics.observe_finished(finished(0.05, 0.5, 64, 10))
        for _ in range(100):
            raw = await redis.get(key)
            if raw and LoadSummary.from_json(raw).num_finished == 1:
                break
            await asyncio.sleep(0.02)
        summary = LoadSummary.from_json(raw)
        assert (summary.num_finished, summary.num_inflight, summary.mean_prompt_tokens) == (1, 4, 64.0)
        assert 0 < await redis.pttl(key) <= 150  # ttl = 3 x interval
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await redis.exists(key) == 0  # a stopping router removes its summary
    assert all(getattr(o, "__self__", None) is None or not isinstance(o.__self__, LoadWindow)
               for o in metrics.FINISHED_OBSERVERS)
    await redis.aclose()
