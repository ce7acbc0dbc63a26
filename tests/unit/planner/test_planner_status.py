"""`pdserve planner status`: the published tick as lines (planner/status.py, plain values), and the
command against a real Redis."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from cli.main import build_parser, main
from pdserve.keys import planner_decision_key
from planner.decision import Decision, ObservedLoad
from planner.model_error import ErrorConfig, Latencies, ModelErrorTracker
from planner.online import Tick
from planner.pool_sizes import PoolSizes
from planner.status import model_summary, status_lines

RAW = Latencies(ttft_p50_s=0.3, ttft_p90_s=0.5, tpot_p50_s=0.04, tpot_p90_s=0.05)
OBSERVED = Latencies(ttft_p50_s=0.3, ttft_p90_s=1.0, tpot_p50_s=0.04, tpot_p90_s=0.05)


def held_tick() -> Tick:
    """A tick whose model under-predicted TTFT p90 by half: the gate refused it, the pools were kept."""
    tracker = ModelErrorTracker(ErrorConfig(min_intervals=1)).record(RAW, OBSERVED, num_finished=20)
    observed = ObservedLoad(arrival_rate_rps=5.0, mean_prompt_tokens=100.0, mean_output_tokens=50.0,
                            ttft_p90_s=1.0, tpot_p90_s=0.05, current=PoolSizes(1, 1), seconds_since_last_scale=0.0,
                            ready=PoolSizes(1, 1))
    decision = Decision(PoolSizes(1, 1), PoolSizes(1, 1), 5.0, ("predicted 5 req/s (last)",))
    return Tick(100.0, observed, decision, False, "model not trusted: (reason)", model=tracker.as_dict())


def test_status_lines_show_the_decision_and_predicted_against_observed_per_metric():
    lines = status_lines(json.loads(held_tick().to_json()), now_s=103.0)
    assert lines == [
        "last tick 3 s ago: kept 1P+1D",
        "  load: 5.00 req/s, 100 prompt and 50 output tokens on average, serving 1P+1D",
        "  reasons: predicted 5 req/s (last)",
        "  note: model not trusted: (reason)",
        "model error, this interval (scored, 20 requests finished); recent = mean |error| over the last 1 of up to "
        "6 scored intervals:",
        "             predicted   observed   error  recent  correction",
        "  TTFT p50      300 ms     300 ms     +0%      0%       x1.00",
        "  TTFT p90      500 ms    1000 ms    -50%     50%       x1.41 (gated)",
        "  TPOT p50     40.0 ms    40.0 ms     +0%      0%       x1.00",
        "  TPOT p90     50.0 ms    50.0 ms     +0%      0%       x1.00 (gated)",
        "gate (bound 25%): not following the model's plan: recent TTFT p90 error 50% > bound 25% over the last 1 "
        "interval "
        "(TTFT p90 50%, TPOT p90 0%)",
    ]


def test_the_per_tick_line_names_the_gated_metrics_and_the_verdict():
    assert model_summary(held_tick().model) == (
        "model: TTFT p90 500 ms predicted / 1000 ms observed (-50%), TPOT p90 50.0 ms predicted / 50.0 ms observed "
        "(+0%); not trusted: recent TTFT p90 error 50% > bound 25% over the last 1 interval "
        "(TTFT p90 50%, TPOT p90 0%)")


def test_a_tick_that_held_for_lack_of_data_is_one_line():
    tick = Tick(100.0, None, None, False, "held: no router published live load")
    assert status_lines(json.loads(tick.to_json()), now_s=110.0) == [
        "last tick 10 s ago: held: no router published live load"]


def test_the_status_command_prints_the_published_tick_or_says_none_is_there(redis_server, capsys):
    cluster = f"st{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_server.url)
    assert main(["planner", "status", "--redis-url", redis_server.url, "--cluster", cluster]) == 1
    assert f"no decision of cluster '{cluster}'" in capsys.readouterr().err
    client.set(planner_decision_key(cluster), held_tick().to_json())
    assert main(["planner", "status", "--redis-url", redis_server.url, "--cluster", cluster]) == 0
    out = capsys.readouterr().out
    assert "kept 1P+1D" in out and "gate (bound 25%): not following the model's plan" in out
    client.close()


def test_the_planner_command_takes_the_error_bound_and_refuses_a_bound_of_zero():
    args = build_parser().parse_args(["planner", "--redis-url", "redis://x", "--max-model-error", "0.4"])
    assert args.action == "run" and args.max_model_error == 0.4
    assert build_parser().parse_args(["planner", "status", "--redis-url", "redis://x"]).action == "status"
    with pytest.raises(SystemExit, match="max_error must be > 0"):
        main(["planner", "--redis-url", "redis://127.0.0.1:1/0", "--max-model-error", "0"])


def test_a_scale_that_failed_says_so_with_the_actuators_error():
    observed = ObservedLoad(arrival_rate_rps=5.0, mean_prompt_tokens=100.0, mean_output_tokens=50.0,
                            ttft_p90_s=0.4, tpot_p90_s=0.05, current=PoolSizes(1, 1), seconds_since_last_scale=0.0,
                            ready=PoolSizes(1, 1))
    decision = Decision(PoolSizes(1, 1), PoolSizes(2, 1), 5.0,
                        ("predicted 5 req/s (last)", "prefill: plan needs 2 > 1"))
    tick = Tick(100.0, observed, decision, False, errors=("scale prefill to 2: the backend refused",))
    lines = status_lines(json.loads(tick.to_json()), now_s=100.0)
    assert lines[0] == "last tick 0 s ago: did not scale 1P+1D -> 2P+1D"
    assert lines[3:] == ["  error: scale prefill to 2: the backend refused",
                         "model error: not judged (this planner has no latency model)"]
