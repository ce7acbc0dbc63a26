"""SLO-driven placement, pure: which path a request takes (llm-d style Filter -> Scorer -> Picker).

    state (WorkerView, RequestView) + cost (CostModel)
      -> paths.predict per candidate (Disaggregated(p, d), Local(d))
      -> filters (hard: local_allowed, kv_fits; soft: ttft_feasible)
      -> scorers in [0, 1], weighted by PlacementConfig.weights
      -> pick.place: the best Placement, or None

Admission (`router.policies.admission`) and the dispatch order (`router.policies.ordering`)
consume its predictions; `gate.dispatch_open` says when a placed request may be sent. No I/O.
"""

from router.policies.placement.config import PlacementConfig
from router.policies.placement.cost import CostModel, OnlinePrefillFit
from router.policies.placement.gate import dispatch_open
from router.policies.placement.paths import Disaggregated, Local, Path, Prediction, predict
from router.policies.placement.pick import Placement, candidate_paths, evaluate, place
from router.policies.placement.state import RequestView, WorkerView

__all__ = ["CostModel", "Disaggregated", "Local", "OnlinePrefillFit", "Path", "Placement", "PlacementConfig",
           "Prediction", "RequestView", "WorkerView", "candidate_paths", "dispatch_open", "evaluate", "place",
           "predict"]
