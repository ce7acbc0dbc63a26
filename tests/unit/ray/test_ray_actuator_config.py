"""The planner's Ray actuator: its configuration and CLI flags, and what it refuses before calling Ray.
(It is exercised against a real Ray cluster in tests/integration/test_ray_cluster.py, with the head's token file.)"""

from __future__ import annotations

import argparse

import pytest

from planner.actuators.base import Actuator
from planner.actuators.ray import RayActuator, RayActuatorConfig, add_cli_arguments, config_from_cli_args


class UnreachableCluster:
    """Stands for a RayCluster; any call fails the test, since validation must come first."""

    def __getattr__(self, name):
        raise AssertionError(f"the actuator called the cluster ({name}) with an invalid request")


def test_the_actuator_satisfies_the_planners_protocol():
    assert isinstance(RayActuator(UnreachableCluster()), Actuator)


@pytest.mark.parametrize("role, replicas, message", [
    ("decode", -1, "must be an int >= 0"), ("decode", 2.0, "must be an int >= 0"), ("router", 1, "role must be"),
])
def test_a_bad_request_is_refused_before_reaching_ray(role, replicas, message):
    with pytest.raises(ValueError, match=message):
        RayActuator(UnreachableCluster()).scale(role, replicas)


def test_cli_flags_name_the_cluster_pdserve_up_started(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    assert config_from_cli_args(parser.parse_args([])) == RayActuatorConfig(address="auto", cluster="default")
    args = parser.parse_args(["--ray-address", "10.0.0.1:6379", "--ray-cluster", "c1", "--ray-auth-token-file", "t"])
    assert config_from_cli_args(args) == RayActuatorConfig(address="10.0.0.1:6379", cluster="c1", auth_token_file="t")


def test_pdserve_planner_declares_the_actuators_flags_as_the_actuator_reads_them():
    """`pdserve planner` declares the Ray flags itself (so its --help does not import Ray): the same
    flags, with the same defaults, as the actuator's own parser."""
    from cli.main import build_parser

    ours = argparse.ArgumentParser()
    add_cli_arguments(ours)
    flags = ["--ray-address", "10.0.0.1:6379", "--ray-cluster", "c1", "--ray-auth-token-file", "t"]
    planner = build_parser().parse_args(["planner", "--redis-url", "redis://h:1/0", "--actuator", "ray", *flags])
    assert config_from_cli_args(planner) == config_from_cli_args(ours.parse_args(flags))


@pytest.mark.parametrize("fields, message", [
    ({"address": ""}, "Ray address is empty"), ({"cluster": "a b"}, "use the --cluster"),
    ({"attach_timeout_s": -1}, "must be >= 0"),
])
def test_bad_config_is_refused_with_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        RayActuatorConfig(**fields)
