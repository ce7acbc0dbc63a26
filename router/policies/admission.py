"""Admission: take a request now, or refuse it with when to come back. Pure.

Contract of `admit(best, request, config, scale, judge_ttft, judge_tpot)` (judge_*: that SLO is set):
- `best` is the placement's prediction for the request (`placement.place(...).prediction`), or
  None when no path can take it at all; `scale` multiplies its TTFT's wait for the prompts
  ahead (the default `calibrate_ttft` "wait"; with "whole", all of its TTFT) and its decode step
  by what recent requests saw against their predictions (`router.policies.calibration`; 1: as
  predicted);
- no path: `Refuse(min_retry_after_s, ..., "no_worker")`;
- with `judge_ttft`, the scaled TTFT above ttft_slo * (1 + refuse_slack): `Refuse` with
  retry_after_s = max(min_retry_after_s, ceil(scaled ttft - ttft_slo)): the predicted time for the
  queues ahead of it to drain until it would meet its SLO, in whole seconds (HTTP Retry-After);
  `by` "ttft";
- with `judge_tpot` (a TPOT SLO is set), the scaled decode step (the decode worker's step once
  this request joins its batch) above tpot_slo * (1 + refuse_slack): `Refuse` after
  `min_retry_after_s` (a running decode ends and frees a place in the batch), `by` "tpot": taking
  it would slow every decode on that worker past the SLO, its own included;
- otherwise `Admit()`.
With the default `refuse_slack` 0 a request is taken only if it is predicted to meet its SLOs:
one admitted to miss them yields no goodput and delays everyone behind it. A slack > 0 admits
late requests too (a client that would rather wait than retry).
The edge maps `Refuse` to RESOURCE_EXHAUSTED / HTTP 429 with Retry-After.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pdserve.errors import refused_by_kinds
from router.policies.calibration import scaled_ttft_s
from router.policies.placement.config import PlacementConfig
from router.policies.placement.paths import Prediction
from router.policies.placement.state import RequestView

_FLOAT_NOISE_S = 1e-9   # so 2.0000000001 s of drain is 2 s, not 3


@dataclass(frozen=True)
class Admit:
    pass


@dataclass(frozen=True)
class Refuse:
    """`reason`: a sentence for the client and the log; `by`: what decided it, one of
    `pdserve.errors.ADMISSION_REFUSED_BY`, for counting."""

    retry_after_s: float
    reason: str
    by: str


@dataclass(frozen=True)
class Scale:
    """Factors applied to a prediction before it is judged (`Calibration.factor()` of each)."""

    ttft: float = 1.0
    tpot: float = 1.0


def admit(best: Prediction | None, request: RequestView, config: PlacementConfig, scale: Scale = Scale(),
          judge_ttft: bool = True, judge_tpot: bool = False) -> Admit | Refuse:
    if best is None:
        return Refuse(config.min_retry_after_s, "no worker can take the request now (no decode worker, or none "
                                                "with free KV blocks for its prompt and max_tokens)", "no_worker")
    allowance = 1.0 + config.refuse_slack
    ttft_s = scaled_ttft_s(best.ttft_s, best.ttft_wait_s, scale.ttft, config.calibrate_ttft)
    limit_s = request.ttft_slo_s * allowance
    if judge_ttft and ttft_s > limit_s:
        drain_s = math.ceil(ttft_s - request.ttft_slo_s - _FLOAT_NOISE_S)
        return Refuse(max(config.min_retry_after_s, float(drain_s)),
                      f"predicted time to first token {ttft_s:.2f} s"
                      f"{_scaled(scale.ttft, 'its wait ' if config.calibrate_ttft == 'wait' else '')} exceeds the limit of "
                      f"{limit_s:.2f} s (SLO {request.ttft_slo_s:.2f} s x {allowance:g})", "ttft")
    tpot_s = best.decode_step_s * scale.tpot
    tpot_limit_s = request.tpot_slo_s * allowance
    if judge_tpot and tpot_s > tpot_limit_s:
        return Refuse(config.min_retry_after_s,
                      f"predicted time per output token {tpot_s * 1e3:.1f} ms{_scaled(scale.tpot)} exceeds the limit "
                      f"of {tpot_limit_s * 1e3:.1f} ms (SLO {request.tpot_slo_s * 1e3:.1f} ms x {allowance:g}): the "
                      f"decode batch is full for this SLO", "tpot")
    return Admit()


def _scaled(factor: float, what: str = "") -> str:
    return "" if factor == 1.0 else f" ({what}x{factor:.2f}, as recent requests saw against their predictions)"


def refusal_counts(by: Mapping[str, int]) -> str:
    """"5 request(s) (ttft 3, tpot 2)": refusals counted by what decided them (`Refuse.by`)."""
    return f"{sum(by.values())} request(s) ({refused_by_kinds(by)})"
