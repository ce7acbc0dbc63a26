"""The placement pipeline: candidates -> predict -> filter -> score -> pick. Pure.

Candidates are every (prefill, decode) pair as `Disaggregated` plus `Local(d)` for every decode
worker. Filters run in `filters.FILTERS` order; a soft filter that would leave nothing is skipped.
The score is the weighted sum of the scorers (`PlacementConfig.weights`).

The picker: the highest score, ties to the smallest `path.key`. When no candidate meets the TTFT
SLO (the soft filter was skipped), TTFT is what is short, and every `ttft_headroom` is clamped to
0 and tells them apart no more: the picker then takes the lowest predicted TTFT (ties: highest
score, then smallest key), so an overloaded cluster still sends each request where it is least late.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.policies.placement.config import PlacementConfig
from router.policies.placement.cost import CostModel
from router.policies.placement.filters import FILTERS
from router.policies.placement.paths import Disaggregated, Local, Path, Prediction, predict
from router.policies.placement.scorers import SCORERS
from router.policies.placement.state import RequestView, WorkerView


@dataclass(frozen=True)
class Placement:
    path: Path
    prediction: Prediction
    score: float
    scores: Mapping[str, float]   # every scorer's value, unweighted (weight 0 ones too)
    meets_ttft_slo: bool = True   # False: no candidate was predicted to meet it


def candidate_paths(workers: Sequence[WorkerView]) -> list[Path]:
    """Every path the workers allow, in `path.key` order."""
    prefill = sorted(w.worker_id for w in workers if w.role == "prefill")
    decode = sorted(w.worker_id for w in workers if w.role == "decode")
    paths: list[Path] = [Disaggregated(p, d) for p in prefill for d in decode]
    return sorted(paths + [Local(d) for d in decode], key=lambda path: path.key)


def evaluate(request: RequestView, workers: Sequence[WorkerView], cost: CostModel,
             config: PlacementConfig) -> list[Placement]:
    """Every candidate that survives the filters, scored, best first (the picker's order)."""
    by_id = _by_id(workers)
    candidates = [(path, predict(path, request, by_id, cost)) for path in candidate_paths(workers)]
    skipped: set[str] = set()
    for name, keep, soft in FILTERS:
        kept = [(path, prediction) for path, prediction in candidates if keep(path, prediction, request, by_id, config)]
        if soft and not kept:
            skipped.add(name)
        else:
            candidates = kept
    meets_slo = "ttft_feasible" not in skipped
    placements = [_scored(path, prediction, request, by_id, config, meets_slo) for path, prediction in candidates]
    if meets_slo:
        return sorted(placements, key=lambda p: (-p.score, p.path.key))
    return sorted(placements, key=lambda p: (p.prediction.ttft_s, -p.score, p.path.key))


def place(request: RequestView, workers: Sequence[WorkerView], cost: CostModel,
          config: PlacementConfig) -> Placement | None:
    """The best placement, or None when no path can take the request at all (no decode worker, or
    every path dropped by a hard filter). A placement that misses the TTFT SLO is still returned:
    `admission.admit` decides on it."""
    ranked = evaluate(request, workers, cost, config)
    return ranked[0] if ranked else None


def _scored(path: Path, prediction: Prediction, request: RequestView, by_id: Mapping[str, WorkerView],
            config: PlacementConfig, meets_slo: bool) -> Placement:
    scores = {name: scorer(path, prediction, request, by_id) for name, scorer in SCORERS.items()}
    total = sum(weight * scores[name] for name, weight in config.weights.items())
    return Placement(path, prediction, total, scores, meets_slo)


def _by_id(workers: Sequence[WorkerView]) -> dict[str, WorkerView]:
    by_id = {w.worker_id: w for w in workers}
    if len(by_id) != len(workers):
        raise ValueError("worker ids must be unique: " + ", ".join(sorted(w.worker_id for w in workers)))
    return by_id
