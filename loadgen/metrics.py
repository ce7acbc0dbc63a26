"""Benchmark metrics with `vllm bench serve`'s definitions and JSON key names (pure functions).

Per successful request (times from sending it):
- TTFT: first content chunk; E2EL: last content chunk;
- TPOT: (E2EL - TTFT) / (output_tokens - 1), only for output_tokens > 1 (for SLO checks a
  one-token output has TPOT 0, as in vLLM's goodput);
- ITL: the gaps between consecutive content chunks, pooled over all requests.
Statistics are mean, median, std and percentiles (numpy's linear interpolation) in ms; an empty
list reads 0 as in vLLM. Throughputs divide by the run duration and count successful requests
only. `failed` counts every unsuccessful request (refusals at admission, errors and timeouts);
`refused` and `timed_out` are subsets of it, so completed + failed == every request sent.

SLO attainment is the share of *all sent* requests that succeeded and met every SLO given (a
failed request misses); a value equal to its limit meets it (vLLM: `slo >= value`);
`request_goodput` is vLLM's: good requests per second of duration.

Peaks (vLLM's `max_output_tokens_per_s`, `max_concurrent_requests`) use 1-second buckets from the
first successful send: the most content chunks that arrived in one bucket (vLLM counts one
token per streamed chunk) and the most successful requests in flight during some part of one
bucket. `achieved_request_rate` is the rate requests actually left the client: requests sent /
the last send's offset from the run's start (the schedule puts the last arrival at exactly
n / request_rate, so this reads the requested rate unless the client or a concurrency cap fell
behind); None when all were sent at once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.runner import RequestRecord

DEFAULT_PERCENTILES = (90.0, 99.0)
PHASES = ("queued", "prefill", "kv_transfer", "decode")


@dataclass(frozen=True)
class SLO:
    """Latency objectives a request must all meet to count as good; None = not checked."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2el_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"SLO {name} must be > 0 seconds (or None to skip it), got {value}")

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2el_s))

    def as_ms(self) -> dict[str, float]:
        """vLLM's `--goodput` form: {"ttft": ms, "tpot": ms, "e2el": ms} for the SLOs set."""
        pairs = (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2el", self.e2el_s))
        return {name: value * 1000 for name, value in pairs if value is not None}


def tpot_s(record: RequestRecord) -> float | None:
    """None for a failed request or a single-token output."""
    if not record.ok or record.output_tokens <= 1:
        return None
    return (record.e2el_s - record.ttft_s) / (record.output_tokens - 1)


def meets_slo(record: RequestRecord, slo: SLO) -> bool:
    if not record.ok:
        return False
    checks = ((record.ttft_s, slo.ttft_s), (tpot_s(record) or 0.0, slo.tpot_s), (record.e2el_s, slo.e2el_s))
    return all(limit is None or value <= limit for value, limit in checks)


def slo_attainment(records: Sequence[RequestRecord], slo: SLO) -> float:
    """Share of the requests (failed ones included, as misses) meeting every SLO; 0 if none."""
    return sum(meets_slo(r, slo) for r in records) / len(records) if records else 0.0


def distribution_ms(name: str, values_s: Sequence[float],
                    percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """mean/median/std/pXX of `values_s` in ms under vLLM's keys, e.g. mean_ttft_ms, p99_ttft_ms."""
    values = np.asarray(values_s if len(values_s) else [0.0], dtype=float) * 1000
    stats = {f"mean_{name}_ms": float(np.mean(values)), f"median_{name}_ms": float(np.median(values)),
             f"std_{name}_ms": float(np.std(values))}
    for p in percentiles:
        stats[f"p{int(p) if int(p) == p else p}_{name}_ms"] = float(np.percentile(values, p))
    return stats


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: SLO | None = None,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """The run's metrics under vLLM's result keys, plus timed_out, refused (at admission; counted
    in `failed` too), slo_attainment (refusals are misses), admitted_slo_attainment (among the
    requests not refused), errors and (for pdserve targets) per-phase distributions."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    good = [r for r in records if r.ok]
    total_input = sum(r.prompt_tokens for r in good)
    total_output = sum(r.output_tokens for r in good)
    summary: dict[str, Any] = {
        "duration": duration_s,
        "num_prompts": len(records),
        "completed": len(good),
        "failed": len(records) - len(good),
        "timed_out": sum(r.status == "timeout" for r in records),
        "refused": sum(r.status == "refused" for r in records),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(good) / duration_s,
        "request_goodput": None,
        "slo_attainment": None,
        "admitted_slo_attainment": None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "output_len_mismatches": sum(r.output_tokens != r.requested_output_tokens for r in good),
        "achieved_request_rate": achieved_request_rate(records),
        **dict(zip(("max_output_tokens_per_s", "max_concurrent_requests"), peaks(good))),
        "errors_by_kind": dict(Counter(r.error[:160] for r in records if not r.ok).most_common()),
    }
    if slo is not None and slo.is_set:
        summary["request_goodput"] = sum(meets_slo(r, slo) for r in records) / duration_s
        summary["slo_attainment"] = slo_attainment(records, slo)
        summary["admitted_slo_attainment"] = slo_attainment([r for r in records if r.status != "refused"], slo)
    summary |= distribution_ms("ttft", [r.ttft_s for r in good], percentiles)
    summary |= distribution_ms("tpot", [t for r in good if (t := tpot_s(r)) is not None], percentiles)
    summary |= distribution_ms("itl", [gap for r in good for gap in r.itls_s], percentiles)
    summary |= distribution_ms("e2el", [r.e2el_s for r in good], percentiles)
    summary |= phase_breakdown(good, percentiles)
    return summary


def achieved_request_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests sent per second of sending: len(records) / the latest `sent_s`; None if that is 0."""
    last_send_s = max((r.sent_s for r in records), default=0.0)
    return len(records) / last_send_s if last_send_s > 0 else None


def peaks(good: Sequence[RequestRecord]) -> tuple[float, int]:
    """(max_output_tokens_per_s, max_concurrent_requests) of successful requests, as vLLM buckets
    them (see the module doc); (0.0, 0) when there are none."""
    if not good:
        return 0.0, 0
    first_s = min(r.sent_s for r in good)
    num_buckets = int(math.ceil(max(r.sent_s + r.e2el_s for r in good) - first_s)) + 1
    chunks = np.zeros(num_buckets)
    in_flight = np.zeros(num_buckets, dtype=int)
    for r in good:
        for t in r.chunk_times_s:  # every chunk lands inside: no chunk is later than its e2el
            chunks[int(r.sent_s + t - first_s)] += 1
        in_flight[int(r.sent_s - first_s):int(r.sent_s + r.e2el_s - first_s) + 1] += 1
    return float(chunks.max()), int(in_flight.max())


def phase_breakdown(records: Sequence[RequestRecord],
                    percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """Distributions of pdserve's per-phase timings; empty when no response carried them."""
    timed = [r.phases for r in records if r.phases is not None]
    if not timed:
        return {}
    stats: dict[str, float] = {}
    for phase in PHASES:
        stats |= distribution_ms(phase, [getattr(t, f"{phase}_s") for t in timed], percentiles)
    stats["mean_kv_transfer_bytes"] = float(np.mean([t.kv_transfer_bytes for t in timed]))
    stats["total_kv_transfer_bytes"] = float(sum(t.kv_transfer_bytes for t in timed))
    stats["disaggregated_requests"] = sum(t.disaggregated for t in timed)
    return stats
