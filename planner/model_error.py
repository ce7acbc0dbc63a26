"""How wrong the performance model is, online: predicted against observed latency every interval,
a correction learned from it, and a gate that refuses to act on a model that is recently wrong.

Pure: no clock, no I/O; `ModelErrorTracker.record` returns a new tracker. The loop
(`planner.online`) feeds it once per interval:

- predicted: the model's p50/p90 TTFT and TPOT (a `LatencyFn`: the fitted model simulated) for
  the load observed in the interval (arrival rate, mean prompt and output lengths) at the
  replicas that served it, times the correction learned from the intervals before;
- observed: the same percentiles over the routers' live-load window (`planner.live`);
- relative error = (predicted - observed) / observed, signed: > 0 the model over-predicts
  latency (pessimistic, it over-provisions), < 0 it under-predicts (optimistic, SLOs break).

An interval is *scored* (it counts for the error and the correction) when the model predicted,
at least `min_finished_requests` requests finished in it (a p90 of three samples is noise),
every gated metric was both predicted and observed, and the caller did not mark it incomparable
(the loop does while the routers' window still holds requests served by pools of another size).

Correction: one multiplicative factor per metric, observed / the model's raw prediction, kept as
an exponentially weighted moving average of its logarithm (weight `smoothing` on the newest
scored interval), clamped to [min_factor, max_factor]. Why this form: what the model misses is
mostly proportional (RPC and streaming overhead, a slower or noisier host stretch every step),
so one factor per metric captures it, and a p90 factor is what the plan can use (it divides the
SLO the plan must meet, `decision.SloScale`, as `decide`'s step 1b does for one interval);
averaging logarithms makes a 2x over- and a 2x under-prediction cancel instead of averaging to
1.25x; the moving average follows a drifting bias and forgets an old one geometrically (a
constant bias b is matched to b ** (1 - (1 - smoothing) ** n) after n scored intervals) while
one noisy interval moves it by its weight only; the clamp keeps an absurd observation (a stalled
router) from steering the plan, and a bias beyond it stays visible as error, so the gate refuses.

Gate (`may_act`): a gated metric's recent error is the mean absolute relative error of the
corrected predictions over the last `window_intervals` scored intervals, each prediction made
with the factors learned *before* its interval (out of sample: the error the corrected model
really has). The loop may act on the model only when at least `min_intervals` intervals were
scored and every gated metric's recent error is <= `max_error`; otherwise the verdict says why.
`max_error` inf turns the gate off (errors are still tracked and the correction still learned).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from planner.decision import SloScale
from planner.pool_sizes import PoolSizes

Metric = Literal["ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"]
METRICS: tuple[Metric, ...] = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")


def label(metric: Metric) -> str:
    """The display name: "ttft_p90" -> "TTFT p90"."""
    name, quantile = metric.split("_")
    return f"{name.upper()} {quantile}"


@dataclass(frozen=True)
class Latencies:
    """p50/p90 TTFT and TPOT in seconds; None where unknown (nothing finished, one output token)."""

    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None

    def of(self, metric: Metric) -> float | None:
        return getattr(self, f"{metric}_s")


# latency(sizes, rate_rps, mean_prompt_tokens, mean_output_tokens) -> the model's percentiles at that load
LatencyFn = Callable[[PoolSizes, float, float, float], Latencies]
Factors = Mapping[Metric, float]
NO_CORRECTION: Factors = dict.fromkeys(METRICS, 1.0)


@dataclass(frozen=True)
class ErrorConfig:
    max_error: float = 0.25  # bound on a gated metric's recent mean |relative error|; inf: never refuse
    window_intervals: int = 6  # scored intervals the recent error is averaged over
    min_intervals: int = 3  # scored intervals needed before the model is trusted at all
    min_finished_requests: int = 10  # an interval with fewer finished requests is not scored
    smoothing: float = 0.5  # weight of the newest scored interval in the correction
    min_factor: float = 0.5  # bounds on the correction (observed / modelled)
    max_factor: float = 10.0
    gated: tuple[Metric, ...] = ("ttft_p90", "tpot_p90")  # what the SLOs (and so the plan) are judged on

    def __post_init__(self) -> None:
        if not self.max_error > 0:
            raise ValueError(f"max_error must be > 0 (0.25 = refuse beyond 25% recent error; inf = never), "
                             f"got {self.max_error}")
        if not 1 <= self.min_intervals <= self.window_intervals:
            raise ValueError(f"need 1 <= min_intervals <= window_intervals, got {self.min_intervals}, "
                             f"{self.window_intervals}")
        if self.min_finished_requests < 1 or not 0 < self.smoothing <= 1:
            raise ValueError(f"need min_finished_requests >= 1 and 0 < smoothing <= 1, got "
                             f"{self.min_finished_requests}, {self.smoothing}")
        if not 0 < self.min_factor <= 1 <= self.max_factor:
            raise ValueError(f"need 0 < min_factor <= 1 <= max_factor, got {self.min_factor}, {self.max_factor}")
        if not self.gated or any(m not in METRICS for m in self.gated):
            raise ValueError(f"gated must name some of {METRICS}, got {self.gated}")


@dataclass(frozen=True)
class IntervalError:
    """One interval: the model's raw prediction, the correction in force then, what was observed."""

    raw: Latencies | None  # None: the model could not predict (no traffic, a pool with nobody serving)
    factors: Factors  # learned before this interval
    observed: Latencies
    num_finished: int
    skipped: str = ""  # why the interval is not scored; "" when it is

    @property
    def scored(self) -> bool:
        return not self.skipped

    def predicted(self, metric: Metric) -> float | None:
        """The corrected prediction: raw x the factor learned before this interval."""
        raw = None if self.raw is None else self.raw.of(metric)
        return None if raw is None else raw * self.factors[metric]

    def relative_error(self, metric: Metric) -> float | None:
        """(predicted - observed) / observed; None when either is unknown."""
        predicted, observed = self.predicted(metric), self.observed.of(metric)
        if predicted is None or observed is None or observed <= 0:
            return None
        return (predicted - observed) / observed


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


@dataclass(frozen=True)
class ModelErrorTracker:
    """The recent intervals and the correction learned so far. Immutable: `record` returns the next."""

    config: ErrorConfig = ErrorConfig()
    factors: Factors = field(default_factory=lambda: dict(NO_CORRECTION))
    recent: tuple[IntervalError, ...] = ()  # scored intervals, oldest first, at most window_intervals
    last: IntervalError | None = None  # the newest interval, scored or not

    def corrected(self, raw: Latencies) -> Latencies:
        """A raw prediction times the current correction (what a later interval will be judged by)."""
        return Latencies(*(None if raw.of(m) is None else raw.of(m) * self.factors[m] for m in METRICS))

    def record(self, raw: Latencies | None, observed: Latencies, num_finished: int,
               incomparable: str = "") -> "ModelErrorTracker":
        """This interval's prediction against its observation. A scored interval joins `recent` and
        moves the correction; any other is kept as `last` only, with the reason it was not scored.
        `incomparable`, when not empty, is the caller's reason the two do not describe the same pools."""
        skipped = incomparable or self._skip_reason(raw, observed, num_finished)
        interval = IntervalError(raw, self.factors, observed, num_finished, skipped)
        if not interval.scored:
            return replace(self, last=interval)
        recent = (self.recent + (interval,))[-self.config.window_intervals:]
        return replace(self, factors=self._updated_factors(interval), recent=recent, last=interval)

    def _skip_reason(self, raw: Latencies | None, observed: Latencies, num_finished: int) -> str:
        if raw is None:
            return "the model made no prediction (no traffic, or a pool with no serving replica)"
        if num_finished < self.config.min_finished_requests:
            return f"{num_finished} requests finished, fewer than {self.config.min_finished_requests}"
        for metric in self.config.gated:
            if raw.of(metric) is None or not raw.of(metric) > 0:
                return f"the model predicted no {label(metric)}"
            if observed.of(metric) is None or not observed.of(metric) > 0:
                return f"no {label(metric)} observed"
        return ""

    def _updated_factors(self, interval: IntervalError) -> Factors:
        low, high, weight = self.config.min_factor, self.config.max_factor, self.config.smoothing
        factors = dict(self.factors)
        for metric in METRICS:
            raw, observed = interval.raw.of(metric), interval.observed.of(metric)
            if raw is None or observed is None or not (raw > 0 and observed > 0):
                continue
            log_factor = (1 - weight) * math.log(factors[metric]) + weight * math.log(observed / raw)
            factors[metric] = min(high, max(low, math.exp(log_factor)))
        return factors

    def recent_error(self, metric: Metric) -> float | None:
        """Mean |relative error| of the corrected predictions over the recent scored intervals."""
        errors = [abs(e) for e in (i.relative_error(metric) for i in self.recent) if e is not None]
        return sum(errors) / len(errors) if errors else None

    def slo_scale(self) -> SloScale:
        """What the plan must meet, as multiples of the SLOs: 1 / the p90 corrections."""
        return SloScale(ttft=1 / self.factors["ttft_p90"], tpot=1 / self.factors["tpot_p90"])

    def as_dict(self) -> dict:
        """JSON-ready (no infinities): per metric the last interval's numbers, the recent error and
        the correction; whether the interval was scored; the gate's verdict."""
        last, verdict = self.last, may_act(self)
        metrics = {metric: {
            "predicted_s": None if last is None else last.predicted(metric),
            "raw_predicted_s": None if last is None or last.raw is None else last.raw.of(metric),
            "observed_s": None if last is None else last.observed.of(metric),
            "error": None if last is None else last.relative_error(metric),
            "recent_error": self.recent_error(metric),
            "correction": self.factors[metric],
        } for metric in METRICS}
        return {"metrics": metrics, "gated": list(self.config.gated),
                "scored": last is not None and last.scored, "skipped": "" if last is None else last.skipped,
                "num_finished": None if last is None else last.num_finished,
                "scored_intervals": len(self.recent), "window_intervals": self.config.window_intervals,
                "max_error": self.config.max_error if math.isfinite(self.config.max_error) else None,
                "may_act": verdict.allowed, "reason": verdict.reason}


def may_act(tracker: ModelErrorTracker) -> Verdict:
    """Whether the loop may act on the model: enough scored intervals, and every gated metric's
    recent error within the bound. The reason names the numbers either way."""
    config = tracker.config
    if math.isinf(config.max_error):
        return Verdict(True, "no bound on the model's error (max_error inf)")
    if len(tracker.recent) < config.min_intervals:
        return Verdict(False, f"only {len(tracker.recent)} of the {config.min_intervals} intervals needed were "
                              f"observed with >= {config.min_finished_requests} finished requests: "
                              "the model's error is not known yet")
    # a scored interval has every gated metric predicted and observed, so each has an error
    errors = {metric: tracker.recent_error(metric) or 0.0 for metric in config.gated}
    summary = ", ".join(f"{label(m)} {e:.0%}" for m, e in errors.items())
    worst = max(errors, key=errors.__getitem__)
    span = f"over the last {len(tracker.recent)} interval" + ("s" if len(tracker.recent) > 1 else "")
    if errors[worst] > config.max_error:
        return Verdict(False, f"recent {label(worst)} error {errors[worst]:.0%} > bound {config.max_error:.0%} "
                              f"{span} ({summary})")
    return Verdict(True, f"recent error {summary} within {config.max_error:.0%} {span}")
