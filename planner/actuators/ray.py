"""Resize the prefill and decode pools of a pdserve cluster that runs as Ray actors.

The cluster is one `pdserve up --ray ADDRESS --cluster NAME`; its controller actor (named
`controller` in the Ray namespace `pdserve-NAME`) owns the members. The actuator attaches to it
and asks it to scale, through the same code `pdserve up --ray` starts the pools with
(`launch.ray.controller`): a new member is a new actor running `pdserve worker`, which registers
in Redis on its own; a removed member is drained (SIGTERM: the worker stops taking requests,
finishes the ones in flight, deregisters) before its actor ends.

Contract (planner/actuators/base.py):
- `current()` is the number of members each pool holds (starting, serving or restarting), i.e.
  the size last asked for, not how many serve now;
- `scale(role, n)` returns once removals have drained and additions are created (Ray accepted
  them; each serves ~20 s later); it is idempotent, and replaces members that can no longer serve;
- every failure raises `RayScaleError` whose message says what to fix.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from planner.actuators.base import ROLES, Role
from launch.ray.cluster import RayCluster, RayClusterError
from launch.ray.spec import CLUSTER_NAME


class RayScaleError(RuntimeError):
    """Ray or the pdserve cluster on it cannot be reached, or refused; the message says what to fix."""


@dataclass(frozen=True)
class RayActuatorConfig:
    address: str = "auto"          # as in `pdserve up --ray ADDRESS`
    cluster: str = "default"       # as in `pdserve up --cluster NAME`
    attach_timeout_s: float = 0.0  # wait this long for the cluster to serve (it may be starting)
    auth_token_file: str = ""      # the Ray cluster's token, as `pdserve up --ray-auth-token-file` ("": Ray's places)

    def __post_init__(self) -> None:
        if not self.address:
            raise ValueError("Ray address is empty: pass the one given to `pdserve up --ray` ('auto' or HOST:PORT)")
        if not CLUSTER_NAME.match(self.cluster):
            raise ValueError(f"cluster name {self.cluster!r}: use the --cluster given to `pdserve up --ray`")
        if self.attach_timeout_s < 0:
            raise ValueError(f"attach_timeout_s must be >= 0, got {self.attach_timeout_s}")


class RayActuator:
    """The planner's Actuator for pools run as Ray actors."""

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster

    @classmethod
    def connect(cls, config: RayActuatorConfig) -> RayActuator:
        try:
            return cls(RayCluster.attach(config.address, config.cluster, config.attach_timeout_s,
                                         config.auth_token_file))
        except RayClusterError as error:
            raise RayScaleError(str(error)) from error

    def current(self) -> dict[Role, int]:
        try:
            sizes = self.cluster.pool_sizes()
        except RayClusterError as error:
            raise RayScaleError(str(error)) from error
        return {role: int(sizes[role]) for role in ROLES}

    def scale(self, role: Role, replicas: int) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas for {role} must be an int >= 0, got {replicas!r}")
        try:
            self.cluster.scale(role, replicas)
        except RayClusterError as error:
            raise RayScaleError(str(error)) from error


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `pdserve planner --actuator ray` reads."""
    group = parser.add_argument_group("Ray actuator (--actuator ray)")
    group.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS", "auto"),
                       help="the Ray cluster given to `pdserve up --ray` (default: env RAY_ADDRESS, else auto)")
    group.add_argument("--ray-cluster", default="default", help="the --cluster given to `pdserve up --ray`")
    group.add_argument("--ray-auth-token-file", metavar="FILE", default="", help=RAY_TOKEN_HELP)


RAY_TOKEN_HELP = ("a file holding the Ray cluster's token (Ray's token authentication is on by default); "
                  "default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token")


def config_from_cli_args(args: argparse.Namespace) -> RayActuatorConfig:
    return RayActuatorConfig(address=args.ray_address, cluster=args.ray_cluster,
                             auth_token_file=args.ray_auth_token_file)
