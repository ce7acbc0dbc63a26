"""The pure parts of bench/unbound_placement.py: its variants (where the router, Redis and the
client run; how long the workers' vLLM processes spin) and the per-variant medians of its runs."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_VARIANT = re.compile(r"floating|router|pinned|spin(\d+(?:\.\d+)?|vllm)")
VLLM_SPIN = -1.0  # the engine option that leaves vLLM's own spin (1 s in vLLM 0.32)
MEDIAN_KEYS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "slo_attainment")


@dataclass(frozen=True)
class Variant:
    name: str
    router_on_prefill: bool  # the router on the prefill worker's cores (`pdserve up`'s default); else any core
    client_on_prefill: bool  # the load generator there too
    spin_ms: float | None    # the workers' vLLM spin cap (VLLM_SPIN: vLLM's own); None: pdserve's default


def parse_variant(text: str) -> Variant:
    """floating (router and client on any core), router (the router on the prefill worker's cores,
    `pdserve up`'s default), pinned (the client there too), spinN (N ms) or spinvllm (vLLM's own
    spin), the last two with the router where `pdserve up` puts it; ValueError naming the forms."""
    name = text.strip()
    match = _VARIANT.fullmatch(name)
    if match is None:
        raise ValueError(f"variant {text!r}: say floating, router, pinned, spinN (N ms, e.g. spin5) or spinvllm")
    spin = match.group(1)
    return Variant(name, router_on_prefill=name != "floating", client_on_prefill=name == "pinned",
                   spin_ms=None if spin is None else VLLM_SPIN if spin == "vllm" else float(spin))


def variant_medians(rows: Sequence[dict], phases: Sequence[str]) -> dict[str, dict]:
    """Per variant (in first-seen order), the median over its runs of each of `MEDIAN_KEYS`, of each
    phase's [p50, p90] (`phases_ms`) and of each CPU group and core; a value no run has is None."""
    def mid(values):
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    out = {}
    for name in dict.fromkeys(r["variant"] for r in rows):
        runs = [r for r in rows if r["variant"] == name]
        out[name] = {"runs": len(runs), **{key: mid(r[key] for r in runs) for key in MEDIAN_KEYS},
                     "phases_ms": {p: [mid(r["phases_ms"][p][i] for r in runs) for i in (0, 1)] for p in phases},
                     "cpu_cores": {g: mid(r["cpu_cores"][g] for r in runs) for g in runs[0]["cpu_cores"]},
                     "core_busy": {c: mid(r["core_busy"][c] for r in runs) for c in runs[0]["core_busy"]}}
    return out
