"""Workloads: what to send and when, as a plain list of `RequestSpec` sorted by arrival.

A workload is built from two independent pieces that compose:
- an **arrival process** gives the send times: `poisson`, `gamma`, `constant` (each returns
  `list[float]`, offsets in seconds from the start of the run, non-decreasing);
- a **length distribution** gives (prompt_tokens, output_tokens) pairs: `uniform_lengths`,
  `fixed_lengths`, or the lengths of a trace.
`combine(arrivals_s, lengths)` zips them into `RequestSpec`s; `shared_prefix` adds the
system-prompt structure; `azure_trace` replays a real trace (its own arrivals and lengths);
`retime` puts any workload's lengths on a new arrival process or rescales it to a target rate.

Everything here is pure and deterministic for a given seed, so the planner's simulator and the
real load generator replay exactly the same requests. Each purpose draws from its own stream of
that seed (`loadgen.seeds`): arrivals, lengths and shared-prefix groups are mutually independent
even when built with the same seed. Fixed concurrency and duration limits are modes of the
runner (`loadgen.runner`), not workloads.

Arrivals follow `vllm bench serve` (`get_request`): the first request comes one gap after the
start, and for a finite n the drawn gaps are rescaled so the last arrival is at exactly
n / rate_rps, i.e. the schedule's realised mean rate is the requested rate, not within
~1/sqrt(n) of it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from loadgen.seeds import Stream, rng

AZURE_CONV_TRACE = "data/traces/AzureLLMInferenceTrace_conv.csv"


@dataclass(frozen=True)
class RequestSpec:
    arrival_s: float  # offset from the start of the run
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None = None  # shared-prefix workload: which system prompt; None = unique
    prefix_tokens: int = 0  # how many leading prompt tokens are the shared prefix

    def __post_init__(self) -> None:
        if self.arrival_s < 0 or not math.isfinite(self.arrival_s):
            raise ValueError(f"arrival_s must be a finite offset >= 0 seconds, got {self.arrival_s}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"a request needs prompt_tokens >= 1 and output_tokens >= 1, "
                f"got {self.prompt_tokens} and {self.output_tokens}"
            )
        if not 0 <= self.prefix_tokens <= self.prompt_tokens:
            raise ValueError(
                f"prefix_tokens ({self.prefix_tokens}) must be in [0, prompt_tokens={self.prompt_tokens}]"
            )
        if (self.prefix_group is None) != (self.prefix_tokens == 0):
            raise ValueError("set prefix_group and prefix_tokens > 0 together (or neither)")


# ----------------------------------------------------------------------------- arrival processes


def _check_rate(rate_rps: float, n: int) -> None:
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0 requests/s, got {rate_rps} (use constant(inf, n) for all-at-once)")
    if n < 0:
        raise ValueError(f"n must be >= 0 requests, got {n}")


def gamma(rate_rps: float, cv: float, n: int, seed: int = 0) -> list[float]:
    """Arrival offsets whose gaps are gamma distributed with mean 1/rate_rps and coefficient of
    variation `cv` (std/mean of the gaps): cv=1 is Poisson, cv>1 bursty, cv<1 smoother.

    The first request arrives after one gap, as in a renewal process started at 0, and the gaps
    are rescaled so the last arrival is at exactly n / rate_rps (vLLM's normalisation: the realised
    mean rate n / last arrival equals rate_rps; the shape of the gaps, hence cv, is unchanged).
    vLLM bench's `--burstiness b` is the gamma shape, i.e. cv = 1/sqrt(b).
    """
    _check_rate(rate_rps, n)
    if not cv > 0:
        raise ValueError(f"cv (burstiness as std/mean of inter-arrival gaps) must be > 0, got {cv}")
    if n == 0:
        return []
    if not math.isfinite(rate_rps):
        return [0.0] * n
    shape = 1.0 / (cv * cv)
    arrivals_s = np.cumsum(rng(seed, Stream.ARRIVALS).gamma(shape, 1.0 / (rate_rps * shape), size=n))
    return (arrivals_s * ((n / rate_rps) / arrivals_s[-1])).tolist()


def poisson(rate_rps: float, n: int, seed: int = 0) -> list[float]:
    """Arrival offsets of a Poisson process: exponential gaps with mean 1/rate_rps."""
    return gamma(rate_rps, 1.0, n, seed)


def constant(rate_rps: float, n: int) -> list[float]:
    """Evenly spaced arrivals 1/rate_rps apart, the first one gap after the start and the last at
    n / rate_rps, as `vllm bench serve --burstiness inf`; rate_rps=inf sends all n at once (at 0)."""
    _check_rate(rate_rps, n)
    return [(i + 1) / rate_rps if math.isfinite(rate_rps) else 0.0 for i in range(n)]


# ---------------------------------------------------------------------------- length distributions


def uniform_lengths(
    n: int,
    prompt_mean: int,
    output_mean: int,
    range_ratio: float = 0.0,
    seed: int = 0,
) -> list[tuple[int, int]]:
    """(prompt_tokens, output_tokens) pairs drawn uniformly from [mean*(1-r), mean*(1+r)]
    (integers, both ends included, never below 1), like `vllm bench serve --dataset-name random`.
    """
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    if prompt_mean < 1 or output_mean < 1:
        raise ValueError(f"mean lengths must be >= 1 token, got prompt {prompt_mean}, output {output_mean}")
    lengths_rng = rng(seed, Stream.LENGTHS)

    def draw(mean: int) -> np.ndarray:
        low = max(1, math.floor(mean * (1 - range_ratio)))
        high = max(low, math.ceil(mean * (1 + range_ratio)))
        return lengths_rng.integers(low, high + 1, size=n)

    prompts, outputs = draw(prompt_mean), draw(output_mean)
    return [(int(p), int(o)) for p, o in zip(prompts, outputs)]


def fixed_lengths(n: int, prompt_tokens: int, output_tokens: int) -> list[tuple[int, int]]:
    """n identical (prompt_tokens, output_tokens) pairs."""
    return [(prompt_tokens, output_tokens)] * n


# -------------------------------------------------------------------------------- composition


def combine(arrivals_s: Sequence[float], lengths: Sequence[tuple[int, int]]) -> list[RequestSpec]:
    """Zip an arrival process with a length distribution; the result is sorted by arrival."""
    if len(arrivals_s) != len(lengths):
        raise ValueError(f"{len(arrivals_s)} arrivals but {len(lengths)} lengths: build both with the same n")
    specs = [RequestSpec(float(a), p, o) for a, (p, o) in zip(arrivals_s, lengths)]
    return sorted(specs, key=lambda s: s.arrival_s)


def shared_prefix(
    arrivals_s: Sequence[float],
    num_groups: int,
    prefix_tokens: int,
    suffix_lengths: Sequence[tuple[int, int]],
    seed: int = 0,
) -> list[RequestSpec]:
    """K=num_groups system prompts of `prefix_tokens` tokens each, every request one of them
    (uniformly at random, from the seed's own group stream, so the group is independent of the
    arrival and of the suffix length even when those were drawn with the same seed) followed by a
    unique suffix: prompt = prefix + suffix tokens.
    `suffix_lengths` are (suffix_tokens, output_tokens) pairs, e.g. from `uniform_lengths`.
    """
    if num_groups < 1 or prefix_tokens < 1:
        raise ValueError(f"need num_groups >= 1 and prefix_tokens >= 1, got {num_groups}, {prefix_tokens}")
    base = combine(arrivals_s, suffix_lengths)
    groups = rng(seed, Stream.PREFIX_GROUPS).integers(0, num_groups, size=len(base))
    return [
        replace(s, prompt_tokens=prefix_tokens + s.prompt_tokens, prefix_group=int(g), prefix_tokens=prefix_tokens)
        for s, g in zip(base, groups)
    ]


def retime(specs: Sequence[RequestSpec], arrivals_s: Sequence[float] | None = None,
           rate_rps: float | None = None) -> list[RequestSpec]:
    """The same requests on new arrivals. Exactly one of:
    - `arrivals_s`: replace the arrival times (e.g. trace lengths on a Poisson process);
    - `rate_rps`: scale the existing gaps so the mean rate is rate_rps (n / last arrival, with the
      first arrival moved to 0), keeping the trace's burstiness.
    """
    if (arrivals_s is None) == (rate_rps is None):
        raise ValueError("pass exactly one of arrivals_s (new times) or rate_rps (rescale existing times)")
    if arrivals_s is not None:
        if len(arrivals_s) != len(specs):
            raise ValueError(f"{len(arrivals_s)} arrivals for {len(specs)} requests: build both with the same n")
        return sorted((replace(s, arrival_s=float(a)) for s, a in zip(specs, arrivals_s)), key=lambda s: s.arrival_s)
    _check_rate(rate_rps, len(specs))
    if not specs:
        return []
    start_s = specs[0].arrival_s
    span_s = specs[-1].arrival_s - start_s
    scale = (len(specs) / rate_rps) / span_s if span_s > 0 else 0.0
    return [replace(s, arrival_s=(s.arrival_s - start_s) * scale) for s in specs]


# ------------------------------------------------------------------------------------- traces


def default_shared_dir() -> Path:
    """`<repo>/../shared`, where the project's shared data lives."""
    return Path(__file__).resolve().parents[1].parent / "shared"


def azure_trace(
    path: str | Path | None = None,
    time_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    limit: int | None = None,
) -> list[RequestSpec]:
    """Replay an Azure LLM inference trace (CSV columns TIMESTAMP, ContextTokens, GeneratedTokens).

    Arrivals are the timestamps' offsets from the first row, multiplied by `time_scale`
    (0.5 = twice as fast). Lengths above the caps are clipped to them; lengths are at least 1.
    `limit` keeps the first N rows. Default path: `<repo>/../shared/data/traces/AzureLLMInferenceTrace_conv.csv`.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0 (0.5 replays twice as fast), got {time_scale}")
    trace_path = Path(path) if path is not None else default_shared_dir() / AZURE_CONV_TRACE
    if not trace_path.is_file():
        raise FileNotFoundError(f"trace file {trace_path} not found: pass its path explicitly")
    specs: list[RequestSpec] = []
    start: datetime | None = None
    with trace_path.open(newline="") as f:
        for row in csv.DictReader(f):
            if limit is not None and len(specs) >= limit:
                break
            at = datetime.fromisoformat(row["TIMESTAMP"].strip())
            start = at if start is None else start
            specs.append(RequestSpec(
                arrival_s=max(0.0, (at - start).total_seconds()) * time_scale,
                prompt_tokens=_clip(int(row["ContextTokens"]), max_prompt_tokens),
                output_tokens=_clip(int(row["GeneratedTokens"]), max_output_tokens),
            ))
    return sorted(specs, key=lambda s: s.arrival_s)


def _clip(tokens: int, cap: int | None) -> int:
    return max(1, tokens if cap is None else min(tokens, cap))
