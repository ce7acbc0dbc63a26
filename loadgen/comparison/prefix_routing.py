"""Prefix-aware against least-loaded routing (pure): the two placement policies compared, and what
one run of each shows. `bench/prefix_routing.py` runs them.

- prefix-aware: pdserve's default placement weights (the router's prefix index feeds the
  predicted TTFT of each path and the `prefix_hit` scorer);
- least-loaded: the same router placing by load alone (`prefill_balance` + `decode_balance`), as a
  router without a prefix index would.

A run's `computed_share` is the prompt tokens the engines computed (their own counters, summed
over workers) over the prompt tokens sent: 1.0 means no prefix was ever reused.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loadgen.metrics import SLO, summarize
from loadgen.runner import RequestRecord

POLICIES: Mapping[str, dict] = {
    "prefix-aware": {},   # the defaults
    "least-loaded": {"weights": {"prefill_balance": 1.0, "decode_balance": 1.0}},
}


@dataclass(frozen=True)
class PrefixRun:
    policy: str
    round: int
    prompt_tokens_sent: int
    prompt_tokens_computed: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    attainment: float
    refused: int   # refused at admission (429): the router's decision, not a lost request
    failed: int    # errors and timeouts, refusals not among them
    other_load_cores: float

    @property
    def computed_share(self) -> float:
        return self.prompt_tokens_computed / self.prompt_tokens_sent if self.prompt_tokens_sent else 0.0


def prefix_run(policy: str, round_index: int, records: Sequence[RequestRecord], duration_s: float,
               computed_tokens: int, slo: SLO, other_load_cores: float) -> PrefixRun:
    """One run's figures from its records and the engines' computed-token delta over the run."""
    summary = summarize(records, duration_s, slo)
    return PrefixRun(policy, round_index, sum(r.prompt_tokens for r in records), computed_tokens,
                     summary["median_ttft_ms"], summary["p90_ttft_ms"], summary["slo_attainment"],
                     summary["refused"], summary["failed"] - summary["refused"], other_load_cores)


def policy_medians(runs: Sequence[PrefixRun]) -> dict[str, dict[str, float]]:
    """policy -> the median over its runs of computed_share, ttft_p50_ms, ttft_p90_ms, attainment."""
    medians = {}
    for policy in dict.fromkeys(r.policy for r in runs):
        own = [r for r in runs if r.policy == policy]
        medians[policy] = {"computed_share": statistics.median(r.computed_share for r in own),
                           "ttft_p50_ms": statistics.median(r.ttft_p50_ms for r in own),
                           "ttft_p90_ms": statistics.median(r.ttft_p90_ms for r in own),
                           "attainment": statistics.median(r.attainment for r in own), "runs": len(own)}
    return medians


def abba(policies: Sequence[str], rounds: int) -> list[tuple[str, int]]:
    """(policy, round) in ABBA order: A,B then B,A, `rounds` times; consecutive runs of one policy
    share its cluster."""
    order = []
    for round_index in range(rounds):
        order += [(p, 2 * round_index) for p in policies] + [(p, 2 * round_index + 1) for p in reversed(policies)]
    return order
