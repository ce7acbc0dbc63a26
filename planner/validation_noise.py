"""How much of a measured percentile is its sample's: the floor under a validation's latency error.

A validation runs each rate once, 30-500 requests, and compares the measured p50/p90 TTFT and TPOT
with the simulated. A model that were exactly right would still miss by the measured percentile's
own sampling error: the same cluster run again on another draw of requests lands elsewhere, most
where the latencies are bimodal (the trace's TTFT: short prompts and long ones) or the sample small
(a p90 of 30 requests is the 27th value). Without that floor a 12% error cannot be read: a model
10% off on a percentile that moves 3% is wrong, one 12% off on a percentile that moves 15% may not be.

The floor here is the bootstrap's: resample the run's own requests with replacement, take the
percentile of each resample, and report the mean |resampled - measured| / measured (for a normal
sampling error that is 0.8 of its relative standard error). It sees the spread of the requests'
latencies, not the run-to-run drift of a VM or the correlation of requests that queue behind each
other (a burst's requests wait together), so it is a lower bound on how far a right model may miss.

Pure: plain arrays in, numbers out, seeded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# the latency keys of a validation's rows (`planner.validation.METRICS`) and the per-request series each is of
PERCENTILE_OF = {"median_ttft_ms": ("ttft", 50.0), "p90_ttft_ms": ("ttft", 90.0),
                 "median_tpot_ms": ("tpot", 50.0), "p90_tpot_ms": ("tpot", 90.0)}
DRAWS = 1000


def latencies_ms(phases: Mapping[str, Sequence[float]], output_tokens: Sequence[int]) -> dict[str, np.ndarray]:
    """Each request's TTFT and TPOT in ms from its measured phases (`planner.validation_phases`:
    TTFT = queue + prefill; TPOT = (first_gap + (output - 2) x steady_gap) / (output - 1), the first
    gap alone for a two-token output), requests without them left out: the series loadgen's
    percentiles are over."""
    queue, prefill = (np.asarray(phases[k], dtype=float) for k in ("queue", "prefill"))
    first_gap, steady_gap = (np.asarray(phases[k], dtype=float) for k in ("first_gap", "steady_gap"))
    outputs = np.asarray(output_tokens, dtype=float)
    ttft = queue + prefill
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs >= 3, (first_gap + (outputs - 2) * steady_gap) / (outputs - 1),
                        np.where(outputs == 2, first_gap, np.nan))
    return {"ttft": 1e3 * ttft[~np.isnan(ttft)], "tpot": 1e3 * tpot[~np.isnan(tpot)]}


def percentile_noise(values: np.ndarray, q: float, draws: int = DRAWS, seed: int = 0) -> float | None:
    """Mean |the q-th percentile of a resample - that of `values`| / that of `values` over `draws`
    bootstrap resamples of `values` (same size, with replacement); None for fewer than two values
    or a percentile of 0."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return None
    point = float(np.percentile(values, q))
    if point <= 0:
        return None
    resamples = np.random.default_rng(seed).choice(values, (draws, len(values)))
    return float(np.mean(np.abs(np.percentile(resamples, q, axis=1) - point)) / point)


def measured_noise(phases: Mapping[str, Sequence[float]], output_tokens: Sequence[int],
                   draws: int = DRAWS, seed: int = 0) -> dict[str, float | None]:
    """`percentile_noise` of each latency key (`PERCENTILE_OF`) over one run's requests."""
    series = latencies_ms(phases, output_tokens)
    return {key: percentile_noise(series[which], q, draws, seed) for key, (which, q) in PERCENTILE_OF.items()}
