"""Scorers: each rates a candidate path in [0, 1], higher is better; `PlacementConfig.weights`
mixes them. Every scorer is clamped, so a weight means the same whatever the load."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from router.policies.placement.paths import Path, Prediction
from router.policies.placement.state import RequestView, WorkerView

Scorer = Callable[[Path, Prediction, RequestView, Mapping[str, WorkerView]], float]


def clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


def ttft_headroom(path: Path, prediction: Prediction, request: RequestView,
                  workers: Mapping[str, WorkerView]) -> float:
    """1 - ttft / ttft_slo: 1 for an instant first token, 0 at (or past) the SLO."""
    return clamp01(1.0 - prediction.ttft_s / request.ttft_slo_s)


def tpot_headroom(path: Path, prediction: Prediction, request: RequestView,
                  workers: Mapping[str, WorkerView]) -> float:
    """1 - per-token time / tpot_slo on the decode worker once this request joins it: its step with
    this request in the batch (`Prediction.decode_step_s`), plus the stall and the KV transfer
    spread over a horizon of `max_tokens` tokens (this request's budget stands in for the running
    requests' unknown remaining tokens)."""
    horizon = max(1, request.max_tokens)
    per_token_s = (prediction.decode_step_s + prediction.decode_stall_s / horizon
                   + prediction.kv_transfer_s / horizon)
    return clamp01(1.0 - per_token_s / request.tpot_slo_s)


def prefix_hit(path: Path, prediction: Prediction, request: RequestView, workers: Mapping[str, WorkerView]) -> float:
    """The share of the prompt cached on the worker that computes it."""
    cached = workers[path.computing_id].cached_prefix_tokens
    return clamp01(min(cached, request.num_prompt_tokens) / request.num_prompt_tokens)


def decode_balance(path: Path, prediction: Prediction, request: RequestView,
                   workers: Mapping[str, WorkerView]) -> float:
    """1 / (1 + running decodes) of the decode worker: spreads decodes when all else is equal."""
    return 1.0 / (1.0 + workers[path.decode_id].running_decodes)


def prefill_balance(path: Path, prediction: Prediction, request: RequestView,
                    workers: Mapping[str, WorkerView]) -> float:
    """1 / (1 + queued prompt tokens / this prompt's tokens) of the computing worker: 1 when idle,
    1/2 with one prompt of this size ahead."""
    queued = workers[path.computing_id].queued_prefill_tokens
    return clamp01(1.0 / (1.0 + queued / request.num_prompt_tokens))


SCORERS: Mapping[str, Scorer] = {
    "ttft_headroom": ttft_headroom,
    "tpot_headroom": tpot_headroom,
    "prefix_hit": prefix_hit,
    "decode_balance": decode_balance,
    "prefill_balance": prefill_balance,
}
DEFAULT_WEIGHTS: Mapping[str, float] = {
    "ttft_headroom": 1.0, "tpot_headroom": 1.0, "prefix_hit": 0.25, "decode_balance": 0.25, "prefill_balance": 0.25,
}
