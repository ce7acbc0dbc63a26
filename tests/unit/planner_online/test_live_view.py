"""The planner's view of live load (planner/live.py): merging routers, ready sizes, ObservedLoad."""

from __future__ import annotations

import pytest

from pdserve.registry import WorkerRecord
from planner.live import LiveLoad, merge_loads, observed_load, ready_sizes
from planner.pool_sizes import PoolSizes
from router.live_stats import LoadSummary


def summary(router: str, finished: int, rate: float, prompt: float, output: float, ttft90: float | None,
            tpot90: float | None, inflight: int = 0) -> LoadSummary:
    return LoadSummary(router, 1.0, 10.0, finished, inflight, rate, prompt, output, None, ttft90, None, tpot90)


def test_two_routers_add_rates_weight_lengths_and_keep_the_worst_p90():
    live = merge_loads([summary("a", 30, 3.0, 100.0, 10.0, 0.5, 0.02, inflight=2),
                        summary("b", 10, 1.5, 500.0, 50.0, 0.9, None, inflight=1)])
    assert live == LiveLoad(num_routers=2, num_finished=40, num_inflight=3, arrival_rate_rps=4.5,
                            mean_prompt_tokens=200.0, mean_output_tokens=20.0, ttft_p90_s=0.9, tpot_p90_s=0.02)


def test_no_router_means_no_data_and_nothing_finished_means_no_lengths():
    assert merge_loads([]) is None
    live = merge_loads([summary("a", 0, 0.4, 0.0, 0.0, None, None, inflight=4)])
    assert live.mean_prompt_tokens is None and live.arrival_rate_rps == 0.4


def test_ready_sizes_skip_draining_workers():
    workers = [WorkerRecord("p0", "prefill", "m", "a:1"), WorkerRecord("d0", "decode", "m", "a:2"),
               WorkerRecord("d1", "decode", "m", "a:3", draining=1), WorkerRecord("d2", "decode", "m", "a:4")]
    assert ready_sizes(workers) == PoolSizes(prefill=1, decode=2)


def test_observed_load_falls_back_to_the_last_lengths_when_nothing_finished():
    live = merge_loads([summary("a", 0, 2.0, 0.0, 0.0, None, None, inflight=20)])
    observed = observed_load(live, PoolSizes(1, 1), PoolSizes(1, 1), 12.0, (1.0,), (256.0, 64.0))
    assert (observed.mean_prompt_tokens, observed.mean_output_tokens) == (256.0, 64.0)
    assert observed.arrival_rate_rps == 2.0 and observed.rate_history_rps == (1.0,)
    assert observed.ready == PoolSizes(1, 1) and observed.seconds_since_last_scale == 12.0
    live = merge_loads([summary("a", 5, 2.0, 80.0, 40.0, 0.1, 0.01)])
    observed = observed_load(live, PoolSizes(1, 1), PoolSizes(1, 1), 12.0, (), (256.0, 64.0))
    assert (observed.mean_prompt_tokens, observed.mean_output_tokens) == pytest.approx((80.0, 40.0))
    assert observed.num_finished == 5   # what the guard weighs its p90s by
