"""Every Redis key pdserve reads or writes, in one place. Redis is the only state the cluster
shares, and these values are a contract with every running process: change none of them.

    pdserve:{cluster}:worker:{worker_id}        hash, a worker's registry entry (`pdserve.registry`);
                                                expires after the worker's ttl_s (its lease)
    pdserve:{cluster}:load:router:{router_id}   JSON, one router's live load (`router.live_stats`);
                                                expires after the publisher's ttl_s
    pdserve:{cluster}:topology                  string, the topology the routers place for ("disaggregated",
                                                "hybrid", "aggregated"), set by the online planner when it
                                                switches; absent: each router's --topology (`router.pool`)
    pdserve:{cluster}:planner:decision          JSON, the online planner's last tick (`planner.online`)
    pdserve:{cluster}:planner:decisions         list, the last ticks, newest first
"""

from __future__ import annotations


def key_prefix(cluster: str) -> str:
    return f"pdserve:{cluster}"


def worker_key(cluster: str, worker_id: str) -> str:
    """A worker's registry hash; `worker_id="*"` is the pattern matching every worker."""
    return f"{key_prefix(cluster)}:worker:{worker_id}"


def router_load_key(cluster: str, router_id: str) -> str:
    """A router's live load summary; `router_id="*"` is the pattern matching every router."""
    return f"{key_prefix(cluster)}:load:router:{router_id}"


def planner_decision_key(cluster: str) -> str:
    return f"{key_prefix(cluster)}:planner:decision"


def planner_decisions_key(cluster: str) -> str:
    return f"{key_prefix(cluster)}:planner:decisions"


def topology_key(cluster: str) -> str:
    return f"{key_prefix(cluster)}:topology"
