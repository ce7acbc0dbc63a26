"""The time budget of a comparison: the whole run, every quiet wait, re-measurement and run
included, fits in `budget_s`. Pure decisions on a clock and a config (`CompareConfig`'s
num_requests, start_estimate_s, run_overhead_s, report_reserve_s, max_quiet_wait_s)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.comparison.config import CompareConfig


@dataclass
class Budget:
    """The run's wall-clock allowance from its creation; `clock` is injectable for tests."""

    total_s: float
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._started = self.clock()

    def remaining_s(self) -> float:
        return self.total_s - (self.clock() - self._started)


def estimate_run_s(config: CompareConfig, rate_rps: float, servers_to_start: int = 0) -> float:
    """Seconds one measurement is expected to take: server starts, arrivals, warm-up and tail."""
    return servers_to_start * config.start_estimate_s + config.num_requests / rate_rps + config.run_overhead_s


def skip_reason(config: CompareConfig, remaining_s: float, need_s: float) -> str | None:
    """Why a point must be skipped for time (None: it fits, the report's reserve kept)."""
    available_s = remaining_s - config.report_reserve_s
    if available_s >= need_s:
        return None
    return f"time budget: needs ~{need_s:.0f} s, {max(0.0, available_s):.0f} s left"


def quiet_wait_s(config: CompareConfig, remaining_s: float, need_s: float) -> float:
    """How long to wait for a quiet machine: up to max_quiet_wait_s, never into the time a run needs."""
    return max(0.0, min(config.max_quiet_wait_s, remaining_s - config.report_reserve_s - need_s))
