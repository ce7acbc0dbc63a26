"""The measurement's rows and what a report says about them: pure functions of the samples."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One method moving one prompt's KV: every timed transfer and their median.

    The fields are the benchmark's JSON record, in this order."""

    prompt_tokens: int
    num_bytes: int
    method: str
    median_s: float
    gb_per_s: float          # num_bytes / median_s, in 10^9 bytes per second
    seconds: list[float]     # the timed transfers, in the order they ran

    @property
    def p25_s(self) -> float:
        return quartiles(self.seconds)[0]

    @property
    def p75_s(self) -> float:
        return quartiles(self.seconds)[1]


def quartiles(seconds: Sequence[float]) -> tuple[float, float]:
    """(p25, p75): the sorted samples at index n // 4 and 3n // 4, no interpolation, so both are
    samples that ran. [4, 1, 3, 2] -> (2, 4)."""
    if not seconds:
        raise ValueError("quartiles of no samples")
    ordered = sorted(seconds)
    return ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]


def summarize(samples: Mapping[tuple[int, str], Sequence[float]], num_bytes: Mapping[int, int]) -> list[Row]:
    """A row per `(prompt_tokens, method)` of `samples`, in its order; `num_bytes[prompt_tokens]`
    is what each of that prompt's transfers moved."""
    rows = []
    for (tokens, method), seconds in samples.items():
        median = statistics.median(seconds)
        rows.append(Row(tokens, num_bytes[tokens], method, median, num_bytes[tokens] / median / 1e9, list(seconds)))
    return rows


def speedup(rows: Sequence[Row], row: Row, reference: str) -> float | None:
    """How many times faster `row` is than method `reference` on the same prompt (their medians'
    ratio; above 1: faster), or None when `reference` was not measured."""
    for other in rows:
        if other.prompt_tokens == row.prompt_tokens and other.method == reference:
            return other.median_s / row.median_s
    return None
