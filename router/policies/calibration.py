"""How far the cost model's predictions fall from what requests then see, learned online. Pure.

Admission compares a prediction with an SLO. A prediction that runs low admits requests that then
miss (past the knee, every one of them takes capacity from the next); one that runs high refuses
requests that would have met it. A `Calibration` keeps the last `window` ratios observed /
predicted of one quantity (the TTFT, or the time per output token against the request's predicted
one: decode step plus its handoff spread over its tokens) and answers `factor()`: the ratios' `quantile`, the scale that would have covered that share
of recent requests. Admission multiplies its prediction by it, so with `quantile` 0.9 a request is
taken when 9 in 10 recent ones predicted like it met the SLO.

- Only observations whose prediction was near enough the SLO to decide anything are kept: at
  least `relevant_share` of it. A request predicted at 20 ms and seen at 40 ms says little of one
  predicted at 1.9 s (most of that error is a fixed cost), and an engine's first, cold requests
  (predicted short, seen long) must not make admission refuse the long prompts that follow them.
  Past the knee the predictions rise with the queue and all become relevant; an idle cluster
  learns little and admits on the model as it is.
- Why a high quantile and not the mean: past the knee admission holds the queue where new
  requests are predicted just under the SLO, so the admitted crowd at the line; scaled by the
  q-th percentile of the error, a share q of those at the line still meet it (more of those
  below it), where an unbiased but noisy prediction alone would let half of them miss. Not
  higher than 0.75 by default: with the few relevant observations a minute holds, a 90th
  percentile is an outlier's value, and it refused requests a real 1P+1D cluster would have
  served within their SLO at half its knee (measured: all 32 admitted met a 2 s TTFT with a p90
  of 0.6 s while 8 of 40 were refused at a factor of 2.7).
- A prior stands in for what has not been seen yet: `prior_weight` pseudo-observations at
  `prior_factor` (1: the cost model as it is) are counted with the kept ratios, so the factor moves
  off the prior as evidence comes in, by as much as the evidence says, instead of jumping at a
  threshold. With the defaults (4 at 1, the 0.75 quantile) two relevant requests that both ran
  slower than predicted already scale admission, by the smaller of their ratios; at 16 the factor
  is the two-thirds point of the ratios, at 64 near their 0.75 quantile. A single outlier moves
  nothing. The pull is not symmetric: ratios below the prior (a pessimistic model) must outnumber
  it three to one before the 0.75 quantile falls below it (12 observations against the prior's 4),
  where two above it move it up: admission trusts a finding that the model runs slow at once, and
  one that it runs fast only on more evidence. Why a prior: with a hard minimum of 16 (before), a
  fresh router or one past a quiet minute decided on the model alone for its first 10-50 requests,
  and on a VM where the model was 14-46% optimistic every request it then admitted to miss was
  admitted there (BENCHMARKS, "Overload on a slow Zen 4 EPYC": 13 of 13). `min_observations`
  (default 1) is still a hard floor below which the factor is the prior; 16 with `prior_weight` 0
  and `prior_factor` 1 is the old rule.
- Observations older than `max_age_s` are forgotten: a factor learned in one burst does not
  outlive it, and a factor high enough to refuse everything (so that nothing new is observed)
  lapses back to the prior instead of refusing for ever.
- What the TTFT factor scales (`PlacementConfig.calibrate_ttft`, `ttft_observation`,
  `scaled_ttft_s`): "wait" (the default), only the prediction's wait for the prompts ahead,
  learned from (observed TTFT - predicted own service) / predicted wait, so only requests that
  waited teach it; or "whole", the whole predicted TTFT, learned from whole TTFTs. The error the
  factor corrects is the queue's (bursts, the host's unbound CPU, a slow stretch of the VM), and it
  grows with the wait: scaling a long prompt's own prefill by it (most of that prompt's
  prediction, and predicted well) refuses the prompts that the queue would have let through.
  Measured: on an AMX VM a whole-TTFT factor of 1.4-2.4 refused 2,000-token prompts that a 1P+1D
  cluster then served within the SLO at the same send times, and on a steady one the whole-TTFT
  admission refused 11 of 80 below the knee where admitting all met the SLO for 94-96% (BENCHMARKS
  "B* on an AMX VM whose speed swings", "B* on an AMX Xeon with the current model"). Below the knee
  the waits are short, so "wait" judges nearly as the uncalibrated model (which measured best there
  on that AMX Xeon); past it the waits are most of the prediction and it scales nearly as "whole".
  Side by side on a Zen 5 EPYC ("Admission's TTFT calibration, the whole prediction or its wait"),
  past the knee it kept as many good requests (1.5x and 2x the knee, four cold starts each: 98.7%
  of the admitted met, 70.6% of the offered, against 98.2% and 68.8%), so it became the default.
  There the tight pick's refusals were nearly all on TPOT (a full decode batch), so the TTFT mode
  decided at most one refusal a run either way.
- The factor stays within [1 / max_factor, max_factor]: a burst of outliers can neither make
  admission refuse everything nor admit everything, and the feedback (a high factor refuses more,
  the load falls, the ratios fall) settles instead of running away.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class CalibrationConfig:
    quantile: float = 0.75         # share of recent requests the scaled prediction covers
    window: int = 64               # recent relevant observations kept
    min_observations: int = 1      # fewer kept: the prior alone
    prior_factor: float = 1.0      # the factor before any evidence (1: the cost model as it is)
    prior_weight: int = 4          # pseudo-observations at prior_factor counted with the kept ratios
    relevant_share: float = 0.25   # kept when the prediction is >= this share of the SLO
    max_factor: float = 4.0        # factor within [1 / max_factor, max_factor]
    max_age_s: float = 60.0        # observations older than this are forgotten

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"the calibration quantile must be in (0, 1), got {self.quantile}")
        if not _is_count(self.window) or self.window < 1:
            raise ValueError(f"window must be a whole number >= 1 of observations, got {self.window!r}")
        if not _is_count(self.min_observations) or not 1 <= self.min_observations <= self.window:
            raise ValueError(f"min_observations must be a whole number within 1..{self.window} (the window), "
                             f"got {self.min_observations!r}")
        if not _is_count(self.prior_weight) or not 0 <= self.prior_weight <= self.window:
            raise ValueError(f"prior_weight must be a whole number within 0..{self.window} (the window) of "
                             f"pseudo-observations, got {self.prior_weight!r}")
        if not 0.0 <= self.relevant_share < 1.0:
            raise ValueError(f"relevant_share must be in [0, 1), got {self.relevant_share}")
        if not (math.isfinite(self.max_factor) and self.max_factor >= 1.0):
            raise ValueError(f"max_factor must be a finite number >= 1, got {self.max_factor}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0 seconds, got {self.max_age_s}")
        if not (math.isfinite(self.prior_factor) and 1.0 / self.max_factor <= self.prior_factor <= self.max_factor):
            raise ValueError(f"prior_factor must be within [1 / max_factor, max_factor] = "
                             f"[{1.0 / self.max_factor:g}, {self.max_factor:g}], got {self.prior_factor}")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Calibration:
    """Observed / predicted ratios of one quantity; `factor(now_s)` scales a new prediction. Times
    are the caller's clock (seconds, monotonic)."""

    def __init__(self, config: CalibrationConfig = CalibrationConfig()):
        self.config = config
        self._ratios: deque[tuple[float, float]] = deque(maxlen=config.window)   # (observed at, ratio)

    def __len__(self) -> int:
        return len(self._ratios)

    def ratios(self) -> list[float]:
        """The observed / predicted ratios kept, oldest first (as of the last `factor` call)."""
        return [ratio for _, ratio in self._ratios]

    def observe(self, predicted_s: float, observed_s: float, slo_s: float, now_s: float = 0.0) -> bool:
        """Keeps observed_s / predicted_s when it bears on a decision against `slo_s`; says whether
        it was kept. Non-positive or non-finite values are ignored (a request with no prediction)."""
        values = (predicted_s, observed_s, slo_s)
        if not all(math.isfinite(v) and v > 0 for v in values):
            return False
        if predicted_s < self.config.relevant_share * slo_s:
            return False
        self._ratios.append((now_s, observed_s / predicted_s))
        return True

    def factor(self, now_s: float = 0.0) -> float:
        """The `quantile` (nearest rank) of the ratios kept in the last `max_age_s` together with
        `prior_weight` copies of `prior_factor`, bounded; the prior with fewer than
        `min_observations` ratios kept."""
        while self._ratios and self._ratios[0][0] < now_s - self.config.max_age_s:
            self._ratios.popleft()
        config = self.config
        if len(self._ratios) < config.min_observations:
            return config.prior_factor
        return pooled_quantile(self.ratios(), config.prior_factor, config.prior_weight, config.quantile,
                               config.max_factor)


def pooled_quantile(ratios: list[float], prior: float, prior_weight: int, quantile: float, bound: float) -> float:
    """The nearest-rank `quantile` of `ratios` pooled with `prior_weight` copies of `prior`, within
    [1 / bound, bound]. With no ratios and no prior weight: the prior. The copies are counted, not
    made: in sorted order they sit after the ratios below the prior."""
    ordered = sorted(ratios)
    size = len(ordered) + prior_weight
    if size == 0:
        return prior
    rank = max(0, math.ceil(quantile * size - 1e-9) - 1)   # the epsilon: 0.56 * 25 is 14.000000000000002
    below = bisect.bisect_left(ordered, prior)
    if rank < below:
        value = ordered[rank]
    elif rank < below + prior_weight:
        value = prior
    else:
        value = ordered[rank - prior_weight]
    return min(bound, max(1.0 / bound, value))


def ttft_observation(predicted_ttft_s: float, predicted_wait_s: float, observed_ttft_s: float,
                     scales: str) -> tuple[float, float]:
    """(predicted, observed) of what the TTFT factor scales, for `Calibration.observe`: the whole
    TTFT, or ("wait") the wait alone: observed = observed TTFT - the predicted own service, at
    least a millisecond (a request that waited less than predicted teaches a ratio near 0, not
    nothing). A request predicted not to wait gives (0, ...), which `observe` ignores."""
    if scales == "whole":
        return predicted_ttft_s, observed_ttft_s
    if scales != "wait":
        raise ValueError(f"the TTFT calibration scales the whole TTFT or its wait, got {scales!r}")
    own_s = predicted_ttft_s - predicted_wait_s
    return predicted_wait_s, max(1e-3, observed_ttft_s - own_s)


def observe_served(calibration: dict[str, Calibration], expected, ttft_s: float, e2e_s: float, output_tokens: int,
                   slo_s: tuple[float, float], ttft_scales: str, now_s: float) -> None:
    """What one served request teaches admission's calibrations (`calibration`: "ttft" and/or
    "tpot"; a live `Scheduler`'s or a simulated router's), `expected` the `Prediction` it was
    admitted on: its TTFT against the predicted TTFT (`ttft_observation`, `ttft_scales`); its time
    per output token after the first against the request's predicted one, the decode step plus its
    handoff (KV transfer) spread over its tokens, like with like (a 3-token answer's TPOT is mostly
    its handoff, under any load). `slo_s`: the (TTFT, TPOT) SLOs each is judged against."""
    if "ttft" in calibration and ttft_s > 0:
        predicted_s, observed_s = ttft_observation(expected.ttft_s, expected.ttft_wait_s, ttft_s, ttft_scales)
        calibration["ttft"].observe(predicted_s, observed_s, slo_s[0], now_s)
    if "tpot" in calibration and output_tokens >= 2 and e2e_s > ttft_s:
        intervals = output_tokens - 1
        predicted_s = expected.decode_step_s + expected.kv_transfer_s / intervals
        calibration["tpot"].observe(predicted_s, (e2e_s - ttft_s) / intervals, slo_s[1], now_s)


def scaled_ttft_s(predicted_ttft_s: float, predicted_wait_s: float, factor: float, scales: str) -> float:
    """The predicted TTFT admission judges: all of it times `factor` ("whole"), or its own service
    as predicted plus its wait times `factor` ("wait")."""
    if scales == "whole":
        return predicted_ttft_s * factor
    if scales != "wait":
        raise ValueError(f"the TTFT calibration scales the whole TTFT or its wait, got {scales!r}")
    return predicted_ttft_s - predicted_wait_s + predicted_wait_s * factor
