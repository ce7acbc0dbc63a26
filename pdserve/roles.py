"""The two worker roles. The one definition every layer uses (registry, workers, router,
launchers, planner): a role is what a worker does with a request, and a pool is its workers."""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = get_args(Role)


def check_role(role: str) -> Role:
    """`role` as a Role, or ValueError saying which roles there are."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role  # type: ignore[return-value]


# How a cluster's pools serve a request (the router's placement reads it; launchers start it):
# - disaggregated: prefill workers prefill, decode workers decode (a decode worker computes a
#   prompt itself only when no prefill worker can take it, or under --local-prefill-max-tokens);
# - hybrid: both pools, and the router may place a request's prefill on a decode worker when that
#   meets its SLOs with more headroom (router.policies.placement);
# - aggregated: decode workers only, each serving both phases (chunked prefill, as vLLM does).
Topology = Literal["disaggregated", "hybrid", "aggregated"]
TOPOLOGIES: tuple[Topology, ...] = get_args(Topology)


def check_topology(topology: str, num_prefill: int) -> Topology:
    """`topology` as a Topology, or ValueError saying how to fix it."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
    if topology == "aggregated" and num_prefill:
        raise ValueError(f"an aggregated cluster has no prefill workers (got {num_prefill}): pass --prefill 0")
    return topology  # type: ignore[return-value]
