"""PNG plots of benchmark results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from loadgen.metrics import SLO, tpot_s  # noqa: E402
from loadgen.runner import RequestRecord  # noqa: E402


def latency_samples_ms(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    good = [r for r in records if r.ok]
    return {
        "TTFT": [r.ttft_s * 1000 for r in good],
        "TPOT": [t * 1000 for r in good if (t := tpot_s(r)) is not None],
        "ITL": [gap * 1000 for r in good for gap in r.itls_s],
        "E2E latency": [r.e2el_s * 1000 for r in good],
    }


def plot_latency_cdfs(runs: Mapping[str, Sequence[RequestRecord]], path: Path, slo: SLO | None = None) -> Path:
    """One panel per metric (TTFT, TPOT, ITL, E2E), one empirical CDF line per labelled run,
    SLOs as dashed vertical lines."""
    limits_ms = {"TTFT": slo.ttft_s, "TPOT": slo.tpot_s, "E2E latency": slo.e2el_s} if slo else {}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    samples = {label: latency_samples_ms(records) for label, records in runs.items()}
    for ax, metric in zip(axes.flat, ("TTFT", "TPOT", "ITL", "E2E latency")):
        for label, by_metric in samples.items():
            values = np.sort(by_metric[metric])
            if len(values):
                ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=label)
        _log_scale_if_wide(ax, [v for by_metric in samples.values() for v in by_metric[metric]])
        if limits_ms.get(metric) is not None:
            ax.axvline(limits_ms[metric] * 1000, color="red", linestyle="--", label="SLO")
        ax.set_title(f"{metric} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("share of requests" if metric != "ITL" else "share of token gaps")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, path)


def plot_attainment(curves: Mapping[str, Sequence[tuple[float, float]]], path: Path, target: float = 0.9,
                    goodputs_rps: Mapping[str, float] | None = None, title: str = "SLO attainment vs offered rate") -> Path:
    """Attainment (0..1) against offered rate (req/s), one line per label, the target as a
    horizontal line and each label's goodput as a dotted vertical line."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in curves.items():
        rates, attainments = zip(*sorted(points)) if points else ((), ())
        line, = ax.plot(rates, attainments, marker="o", label=label)
        if goodputs_rps and goodputs_rps.get(label):
            ax.axvline(goodputs_rps[label], color=line.get_color(), linestyle=":",
                       label=f"{label} goodput {goodputs_rps[label]:.2f} req/s")
    ax.axhline(target, color="red", linestyle="--", label=f"target {target:.0%}")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _log_scale_if_wide(ax: plt.Axes, values_ms: Sequence[float]) -> None:
    """Log x axis when the values span more than 30x, so a tail does not flatten the body."""
    positive = [v for v in values_ms if v > 0]
    if positive and max(positive) > 30 * min(positive):
        ax.set_xscale("log")
        decades = np.log10(max(positive) / min(positive))
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))  # 100, 200, 500 ...
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
