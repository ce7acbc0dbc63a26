"""The same validation run several times: how far the runs land from each other, and the simulator
from their mean. (Pure; bench/validate_planner.py --repeats runs the passes, --resimulate with
several directories compares kept ones.)

One run of a shape cannot say whether a 15% goodput error is the simulator's: on a shared VM the
measured knee of one shape moved 8.2 / 11.4 / 10.1 req/s over three runs within an hour
(BENCHMARKS, "Where the client runs"). The bootstrap floor beside each percentile
(`planner.validation_noise`) sees the spread of one run's requests, not that drift. Run the same
requests again, interleaved with the other shapes (A B C D, A B C D: a drift of the host lands on
every shape alike, not on one), and the runs' own spread is the floor under the error a single run
shows:

- goodput: each run's, where attainment crosses the target on the run's grid; their spread is the
  mean |run - the runs' mean| / the runs' mean (what one run's error is against the truth, on
  average, were the runs' mean the truth); the simulator's error against the runs' mean, against
  each run (the mean |error| a one-run validation would have reported) and whether it falls
  between the lowest and the highest run;
- latency percentiles, at the rates every run measured (the grid; each run's refinement of its
  knee is its own): at each rate the runs' mean and spread (as above), averaged over the rates up
  to the knee of the runs' mean attainment, beside the simulator's mean |error| against the runs'
  mean over the same rates.

Spreads of two or three runs are rough (the mean distance from their own mean understates a normal
spread by about 30% for two runs and a fifth for three); they say whether an error is of the size
of the noise, not its decimal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from loadgen.comparison.goodput import format_goodput
from loadgen.sweep import goodput_on_grid
from planner.validation import LATENCY_KEYS, METRICS, Comparison, rates_to_knee, save_figure

Goodput = tuple[float, bool]  # (req/s, bracketed by the grid): `loadgen.sweep.goodput_on_grid`


@dataclass(frozen=True)
class Repeats:
    """One shape on one topology, one model, run several times."""

    shape: str
    topology: str
    model: str
    measured_goodputs: tuple[Goodput, ...]  # each run's
    simulated_goodputs: tuple[Goodput, ...]  # the simulator's on each run's requests and grid
    grid_rps: tuple[float, ...]  # the rates every run measured; () when none
    rates_to_knee: tuple[float, ...]  # of those, up to the knee of the runs' mean attainment
    spread_to_knee: dict[str, float | None]  # latency key -> the runs' mean spread over those rates
    error_to_knee: dict[str, float | None]  # latency key -> mean |simulated - the runs' mean| / the runs' mean
    bias_to_knee: dict[str, float | None]  # latency key -> the same, signed (+ the simulator pessimistic)
    grids_rps: tuple[tuple[float, ...], ...] = ()  # each run's grid (for a bound's text)

    @property
    def runs(self) -> int:
        return len(self.measured_goodputs)

    @property
    def bracketed(self) -> bool:
        """Every run's goodput, measured and simulated, found inside its grid."""
        return all(bracketed for _, bracketed in self.measured_goodputs + self.simulated_goodputs)

    @property
    def measured_mean_rps(self) -> float:
        return _mean([rps for rps, _ in self.measured_goodputs])

    @property
    def simulated_mean_rps(self) -> float:
        return _mean([rps for rps, _ in self.simulated_goodputs])

    @property
    def goodput_spread(self) -> float | None:
        """The runs' mean |goodput - their mean| / their mean; None unless every run's measured
        goodput is bracketed and their mean positive."""
        if not all(bracketed for _, bracketed in self.measured_goodputs):
            return None
        return spread([rps for rps, _ in self.measured_goodputs])

    @property
    def goodput_error(self) -> float | None:
        """(the simulated mean - the measured mean) / the measured mean; None unless bracketed."""
        if not self.bracketed or self.measured_mean_rps <= 0:
            return None
        return (self.simulated_mean_rps - self.measured_mean_rps) / self.measured_mean_rps

    @property
    def one_run_goodput_error(self) -> float | None:
        """The mean over runs of |simulated - measured| / measured: what a one-run validation would
        have reported, on average; None unless bracketed."""
        if not self.bracketed or any(rps <= 0 for rps, _ in self.measured_goodputs):
            return None
        return _mean([abs(s - m) / m for (m, _), (s, _) in zip(self.measured_goodputs, self.simulated_goodputs)])

    @property
    def simulated_within_runs(self) -> bool | None:
        """The simulated mean between the lowest and the highest run's goodput; None unless bracketed."""
        if not self.bracketed:
            return None
        measured = [rps for rps, _ in self.measured_goodputs]
        return min(measured) <= self.simulated_mean_rps <= max(measured)


def spread(values: Sequence[float]) -> float | None:
    """mean |value - mean| / mean; None for fewer than two values or a mean of 0 or less."""
    if len(values) < 2:
        return None
    mean = _mean(values)
    return _mean([abs(v - mean) for v in values]) / mean if mean > 0 else None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def repeats(runs: Sequence[Sequence[Comparison]], shape: str, topology: str, model: str,
            target: float = 0.9) -> Repeats:
    """`model`'s comparisons of one shape and topology in each of several runs (one sequence a run)
    taken together. ValueError when a run has no comparison for `model`."""
    rows = [sorted((c for c in run if c.model == model), key=lambda c: c.rate_rps) for run in runs]
    if not all(rows):
        raise ValueError(f"a run without a comparison for model {model!r} of {shape} on {topology}")
    measured = tuple(goodput_on_grid([(c.rate_rps, c.measured["slo_attainment"]) for c in run], target) for run in rows)
    simulated = tuple(goodput_on_grid([(c.rate_rps, c.simulated["slo_attainment"]) for c in run], target)
                      for run in rows)
    grids = tuple(tuple(c.rate_rps for c in run) for run in rows)
    shared = sorted(set.intersection(*(set(grid) for grid in grids)))
    if not shared:
        unknown = dict.fromkeys(LATENCY_KEYS)
        return Repeats(shape, topology, model, measured, simulated, (), (), dict(unknown), dict(unknown), dict(unknown),
                       grids)
    # each shared rate's comparisons, one a run
    by_rate = [[next(c for c in run if c.rate_rps == rate) for run in rows] for rate in shared]
    knee = rates_to_knee([_mean([c.measured["slo_attainment"] for c in at]) for at in by_rate], target)
    spreads, errors, biases = {}, {}, {}
    for key in LATENCY_KEYS:
        at_rates = [([float(c.measured[key]) for c in at], [float(c.simulated[key]) for c in at])
                    for at in by_rate[:knee]]
        signed = [(_mean(sim) - _mean(real)) / _mean(real) for real, sim in at_rates if _mean(real) > 0]
        known = [s for real, _ in at_rates if (s := spread(real)) is not None]
        spreads[key] = _mean(known) if known else None
        errors[key] = _mean([abs(e) for e in signed]) if signed else None
        biases[key] = _mean(signed) if signed else None
    return Repeats(shape, topology, model, measured, simulated, tuple(shared), tuple(shared[:knee]), spreads, errors,
                   biases, grids)


def _percent(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.0%}" if signed else f"{value:.0%}")


def _goodputs(r: Repeats, goodputs: tuple[Goodput, ...]) -> str:
    """Each run's goodput, a bound as a bound (`format_goodput`)."""
    return " / ".join(format_goodput(g, grid) for g, grid in zip(goodputs, r.grids_rps or [r.grid_rps] * r.runs))


def _simulated(r: Repeats) -> str:
    """The simulated goodputs' mean, or each run's where any is a bound."""
    if all(bracketed for _, bracketed in r.simulated_goodputs):
        return f"{r.simulated_mean_rps:.2f}"
    return _goodputs(r, r.simulated_goodputs)


def _latency(r: Repeats, key: str) -> str:
    """ "12% (+8%; runs 6%)": the mean |error| against the runs' mean, signed, and their spread."""
    if r.error_to_knee.get(key) is None:
        return "-"
    return (f"{r.error_to_knee[key]:.0%} ({r.bias_to_knee[key]:+.0%}; runs "
            f"{_percent(r.spread_to_knee.get(key))})")


HEADERS = ("shape", "topology", "model", "runs", "goodput each run req/s", "runs' spread", "simulated req/s",
           "err to runs' mean", "one run's err", "sim within runs",
           *(f"{dict(METRICS)[key]} err (signed; runs' spread)" for key in LATENCY_KEYS))


def _cells(r: Repeats) -> tuple[str, ...]:
    within = "-" if r.simulated_within_runs is None else ("yes" if r.simulated_within_runs else "no")
    return (r.shape, r.topology, r.model, str(r.runs), _goodputs(r, r.measured_goodputs), _percent(r.goodput_spread),
            _simulated(r), _percent(r.goodput_error, signed=True), _percent(r.one_run_goodput_error),
            within, *(_latency(r, key) for key in LATENCY_KEYS))


def repeats_table(rows: Sequence[Repeats]) -> Table:
    """Shape x topology rows: each run's goodput, their spread, the simulator's against their mean
    and against each run; each latency's error against the runs' mean up to the knee, with the
    runs' spread beside it."""
    table = Table(title="the same validation run several times: the runs' spread against the simulator's error "
                        "(latencies: mean |error| against the runs' mean up to its knee; + the simulator pessimistic)")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in HEADERS[:3] else "right")
    for r in rows:
        table.add_row(*_cells(r))
    return table


def repeats_markdown(rows: Sequence[Repeats]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|---" * len(HEADERS) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def repeats_to_json(rows: Sequence[Repeats]) -> list[dict[str, Any]]:
    return [{"shape": r.shape, "topology": r.topology, "model": r.model, "runs": r.runs,
             "goodput_rps": {"measured": [list(g) for g in r.measured_goodputs],
                             "simulated": [list(g) for g in r.simulated_goodputs],
                             "measured_mean": r.measured_mean_rps, "simulated_mean": r.simulated_mean_rps},
             "goodput_spread": r.goodput_spread, "goodput_error_to_mean": r.goodput_error,
             "one_run_goodput_error": r.one_run_goodput_error, "simulated_within_runs": r.simulated_within_runs,
             "grid_rps": list(r.grid_rps), "rates_to_knee": list(r.rates_to_knee),
             "spread_to_knee": r.spread_to_knee, "error_to_knee": r.error_to_knee, "bias_to_knee": r.bias_to_knee}
            for r in rows]


def write_repeats_files(out_dir: Path, rows: Sequence[Repeats], passes: int, sources: Sequence[str] = ()) -> list[Path]:
    """repeats.json (`repeats_to_json`, with the number of passes and the earlier runs' directories
    they resimulated, if any), repeats.md and repeats.png under `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "repeats.json").write_text(json.dumps(
        {"passes": passes, "sources": list(sources) or None, "repeats": repeats_to_json(rows)}, indent=1))
    (out_dir / "repeats.md").write_text(repeats_markdown(rows))
    png = plot_repeats(rows, out_dir / "repeats.png", f"the same validation run {passes} times")
    return [out_dir / "repeats.json", out_dir / "repeats.md", png]


def plot_repeats(rows: Sequence[Repeats], path: Path, title: str) -> Path:
    """Left: each run's measured goodput (dots) and their range (a bar) beside the simulated mean
    (a diamond), per shape and topology (one model: the first). Right: each latency's error against
    the runs' mean up to the knee (bars) with the runs' spread (a tick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    first = rows[0].model
    shown = [r for r in rows if r.model == first]
    x = np.arange(len(shown))
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(shown)) * 2, 4.6))
    for i, r in enumerate(shown):
        measured = [rps for rps, _ in r.measured_goodputs]
        left.vlines(i, min(measured), max(measured), color="gray", linewidth=6, alpha=0.5,
                    label="the runs' range" if i == 0 else None)
        left.scatter([i] * len(measured), measured, color="black", zorder=3, label="each run" if i == 0 else None)
        bound = not all(bracketed for _, bracketed in r.simulated_goodputs)   # hollow: a bound
        left.scatter([i + 0.15], [r.simulated_mean_rps], marker="D", zorder=3, edgecolors="tab:blue",
                     facecolors="none" if bound else "tab:blue",
                     label=f"simulated: {first} (hollow: a bound)" if i == 0 else None)
    left.set_ylabel("goodput (req/s at 90% attainment)")
    left.set_title("goodput, each run against the simulator")
    width = 0.8 / len(LATENCY_KEYS)
    for i, key in enumerate(LATENCY_KEYS):
        at = x - 0.4 + (i + 0.5) * width
        right.bar(at, [100 * (r.error_to_knee.get(key) or 0.0) for r in shown], width, label=dict(METRICS)[key])
        ticks = [(a, 100 * s) for a, r in zip(at, shown) if (s := r.spread_to_knee.get(key)) is not None]
        if ticks:
            right.scatter(*zip(*ticks), marker="_", s=120, color="black",
                          label="the runs' spread" if i == 0 else None)
    right.axhline(10, color="gray", linestyle="--", linewidth=1, label="10% aim")
    right.set_ylabel("mean |error| against the runs' mean up to the knee, %")
    right.set_title("latency error against the runs' spread")
    for ax in (left, right):
        ax.set_xticks(x, [f"{r.shape}\n{r.topology}" for r in shown], fontsize=8)
        ax.legend(fontsize=8)
    return save_figure(fig, path, title)
