"""Conditional disaggregation: when is a prompt worth a prefill worker and a KV transfer?

A short prompt costs less to compute on the decode worker than to prefill elsewhere and move its
KV; a prompt mostly in the decode worker's prefix cache too. The threshold is policy data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DisaggregationPolicy:
    local_prefill_max_tokens: int = 0   # prompts this short run on a decode worker alone (0: never)

    def __post_init__(self) -> None:
        if self.local_prefill_max_tokens < 0:
            raise ValueError("local_prefill_max_tokens must be >= 0")

    def disaggregate(self, num_prompt_tokens: int, has_prefill_workers: bool) -> bool:
        return has_prefill_workers and num_prompt_tokens > self.local_prefill_max_tokens
