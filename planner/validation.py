"""Measured against simulated: do the planner's predictions hold? (pure; bench/validate_planner.py
runs the real cluster and calls these.)

For each offered rate the same request list runs on the real cluster (loadgen) and through the
simulator with each profile's fitted model. Errors per metric:
- latencies (p50/p90 TTFT and TPOT): relative, (simulated - measured) / measured;
- SLO attainment: the difference in percentage points (a relative error of a share near 0 says
  little), reported in the same "%" column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

METRICS: tuple[tuple[str, str], ...] = (
    ("median_ttft_ms", "TTFT p50"), ("p90_ttft_ms", "TTFT p90"),
    ("median_tpot_ms", "TPOT p50"), ("p90_tpot_ms", "TPOT p90"),
    ("slo_attainment", "attainment"),
)


@dataclass(frozen=True)
class Comparison:
    """One rate, one model: loadgen's summary of the real run and the simulator's of the same requests."""

    rate_rps: float
    model: str
    measured: dict[str, Any]
    simulated: dict[str, Any]

    def error(self, key: str) -> float:
        """Relative error of a latency; percentage-point difference (as a fraction) for attainment."""
        measured, simulated = float(self.measured[key]), float(self.simulated[key])
        if key == "slo_attainment":
            return simulated - measured
        return (simulated - measured) / measured if measured > 0 else float("inf")


def mean_abs_errors(comparisons: Sequence[Comparison], model: str) -> dict[str, float]:
    """Mean |error| per metric over the rates, for one model."""
    rows = [c for c in comparisons if c.model == model]
    return {key: sum(abs(c.error(key)) for c in rows) / len(rows) for key, _ in METRICS} if rows else {}


def error_table(comparisons: Sequence[Comparison], title: str) -> Table:
    table = Table(title=title)
    table.add_column("rate req/s", justify="right")
    table.add_column("model")
    for _, label in METRICS:
        table.add_column(f"{label} real / sim (err)", justify="right")
    for c in comparisons:
        cells = []
        for key, _ in METRICS:
            if key == "slo_attainment":
                cells.append(f"{c.measured[key]:.0%} / {c.simulated[key]:.0%} ({c.error(key) * 100:+.0f} pp)")
            else:
                cells.append(f"{c.measured[key]:.1f} / {c.simulated[key]:.1f} ({c.error(key):+.0%})")
        table.add_row(f"{c.rate_rps:.2f}", c.model, *cells)
    for model in dict.fromkeys(c.model for c in comparisons):
        errors = mean_abs_errors(comparisons, model)
        cells = [f"{errors[key] * 100:.0f} pp" if key == "slo_attainment" else f"{errors[key]:.0%}" for key, _ in METRICS]
        table.add_row("mean |err|", model, *cells, style="bold")
    return table


def to_json(comparisons: Sequence[Comparison]) -> dict[str, Any]:
    keys = [key for key, _ in METRICS]
    models = list(dict.fromkeys(c.model for c in comparisons))
    return {
        "metrics": keys,
        "runs": [{"rate_rps": c.rate_rps, "model": c.model,
                  "measured": {k: c.measured[k] for k in keys}, "simulated": {k: c.simulated[k] for k in keys},
                  "error": {k: c.error(k) for k in keys}} for c in comparisons],
        "mean_abs_error": {m: mean_abs_errors(comparisons, m) for m in models},
    }


def plot_validation(comparisons: Sequence[Comparison], path: Path, title: str) -> Path:
    """One panel per metric: measured (black) and each model's simulation against the offered rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 4.2))
    models = list(dict.fromkeys(c.model for c in comparisons))
    for ax, (key, label) in zip(axes, METRICS):
        first = [c for c in comparisons if c.model == models[0]]
        ax.plot([c.rate_rps for c in first], [c.measured[key] for c in first], "ko-", label="measured")
        for model in models:
            rows = [c for c in comparisons if c.model == model]
            ax.plot([c.rate_rps for c in rows], [c.simulated[key] for c in rows], "s--", label=f"simulated: {model}")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("share of requests" if key == "slo_attainment" else "ms")
        ax.set_title(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
