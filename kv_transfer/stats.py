"""What the connector reports through vLLM's stats path, and how a reader gets it back.

The scheduler half knows how many prefilled requests keep their blocks pinned for a consumer
(granted leases not yet reported as `finished_sending`). It returns that count every engine step
from `get_kv_connector_stats()`; vLLM puts `to_dict()` into `SchedulerStats.kv_connector_stats`,
which every stat logger receives (pdserve's `EngineLoad` among them). A gauge, not a counter:
the latest value wins when stats are aggregated. The stats class is `metadata.PDConnectorStats`;
this module stays importable without vLLM.
"""

from __future__ import annotations

from typing import Any

HELD_LEASES = "pdserve_held_leases"


def held_leases(kv_connector_stats: dict[str, Any] | None) -> int:
    """The producer's pinned transfers from a `SchedulerStats.kv_connector_stats` payload (0 when
    the payload is absent or comes from another connector)."""
    return int((kv_connector_stats or {}).get(HELD_LEASES, 0))
