"""The dispatch gate: hold a request in the router's queue while its worker is busy enough.

Requests wait in the router (`router.policies.ordering.DispatchQueue`, where SLO classes and
shortest-first apply) rather than in a worker's FIFO queue, where they can no longer be reordered
or re-placed. A worker is open while the prompt tokens queued there are below
`max_queued_prefill_tokens_per_worker`; an idle worker is always open, so a prompt longer than the
gate still goes when its worker is idle.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.policies.placement.config import PlacementConfig
from router.policies.placement.paths import Path
from router.policies.placement.state import WorkerView


def dispatch_open(path: Path, workers_by_id: Mapping[str, WorkerView], config: PlacementConfig) -> bool:
    """True when a request placed on `path` may be sent now (the gate looks at the worker that
    computes the prompt). A gate of 0 is always open."""
    limit = config.max_queued_prefill_tokens_per_worker
    return limit == 0 or workers_by_id[path.computing_id].queued_prefill_tokens < limit
