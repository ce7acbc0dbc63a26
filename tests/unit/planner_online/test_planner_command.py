"""`pdserve planner`: its actuator flags match the actuators' own, and one dry-run decision end to end
against a real Redis with a router's summary in it."""

from __future__ import annotations

import argparse
import json
import uuid

import pytest
import redis

from cli.main import build_parser, main
from pdserve.registry import WorkerRecord
from pdserve.keys import planner_decision_key, router_load_key
from router.live_stats import LoadSummary


def _options(parser: argparse.ArgumentParser, prefix: str) -> dict[str, object]:
    """option string -> default, for the options starting with `prefix`."""
    return {opt: action.default for action in parser._actions for opt in action.option_strings
            if opt.startswith(prefix)}


def _planner_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["planner"]


@pytest.mark.parametrize("module, prefixes", [("kubernetes", ("--k8s-", "--kubeconfig")), ("ray", ("--ray-",))])
def test_actuator_flags_are_the_actuators_own(module, prefixes):
    import importlib

    own = argparse.ArgumentParser()
    importlib.import_module(f"planner.actuators.{module}").add_cli_arguments(own)
    mine = _planner_parser()
    for prefix in prefixes:
        assert _options(mine, prefix) == _options(own, prefix) != {}


def _seeded_cluster(redis_url: str) -> tuple[str, redis.Redis]:
    """A fresh cluster name in Redis holding one router's summary (5 req/s, 50 finished, TPOT p90
    0.06 s) and the records of a 1P+1D cluster; and a client to read what the planner publishes."""
    cluster = f"cli{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    summary = LoadSummary("r1", 0.0, 10.0, 50, 3, 5.0, 512.0, 128.0, 0.3, 0.6, 0.04, 0.06)
    client.set(router_load_key(cluster, "r1"), summary.to_json(), px=60_000)
    for worker_id, role in (("p0", "prefill"), ("d0", "decode")):
        client.hset(f"pdserve:{cluster}:worker:{worker_id}", mapping=WorkerRecord(worker_id, role, "m", "x:1").to_hash())
    return cluster, client


def test_once_dry_run_prints_one_decision_and_publishes_it(redis_server, capsys):
    cluster, client = _seeded_cluster(redis_server.url)
    code = main(["planner", "--redis-url", redis_server.url, "--cluster", cluster, "--once", "--dry-run",
                 "--model", "unused", "--sim-requests", "100", "--tpot-slo-s", "0.05", "--ttft-slo-s", "1"])
    assert code == 0
    published = json.loads(client.get(planner_decision_key(cluster)))
    # the example profile (bench model, 2 cores): 5 req/s of 512/128 tokens needs more than 1P+1D
    assert published["current"] == {"prefill": 1, "decode": 1} and published["applied"] is False
    assert published["target"]["decode"] > 1 and published["observed"]["arrival_rate_rps"] == 5.0
    out = capsys.readouterr().out
    assert "would scale 1P+1D -> 1P+" in out and "rate 5.00 req/s" in out
    client.close()


def test_local_actuator_needs_the_model(redis_server):
    with pytest.raises(SystemExit, match="--actuator local needs --model"):
        main(["planner", "--redis-url", redis_server.url, "--cluster", "nomodel", "--once"])


def test_the_guards_bar_is_a_flag(redis_server):
    """The routers' window holds 50 finished requests with a TPOT p90 (0.06 s) over the SLO: with the
    bar at 100 the guard says so and does not act on it."""
    cluster, client = _seeded_cluster(redis_server.url)
    assert main(["planner", "--redis-url", redis_server.url, "--cluster", cluster, "--once", "--dry-run",
                 "--model", "unused", "--sim-requests", "100", "--tpot-slo-s", "0.05", "--ttft-slo-s", "1",
                 "--min-requests-for-guard", "100"]) == 0
    reasons = " ".join(json.loads(client.get(planner_decision_key(cluster)))["reasons"])
    assert "over only 50 request(s) (< 100): not acted on" in reasons
    client.close()
