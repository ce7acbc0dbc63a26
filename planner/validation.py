"""Measured against simulated: do the planner's predictions hold? (pure; bench/validate_planner.py
runs the real cluster and calls these.)

For each offered rate the same request list runs on the real cluster (loadgen) and through the
simulator with each profile's fitted model. Errors per metric:
- latencies (p50/p90 TTFT and TPOT): relative, (simulated - measured) / measured;
- SLO attainment: the difference in percentage points (a relative error of a share near 0 says
  little), reported in the same "%" column;
- beside each measured latency percentile, its sampling noise (`planner.validation_noise`: how far
  the same percentile of a resample of the run's own requests lands, relative): the floor under
  the error, that a model exactly right would still show on a run of this size.
Per workload shape and topology (`Verdict`): the latency errors averaged over the rates up to the
measured knee (where the planner must be right; past it latencies grow without bound and a
relative error there says little), and the goodput each side puts where its attainment curve
crosses the target on the same grid of rates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from loadgen.comparison.goodput import format_goodput
from loadgen.sweep import goodput_on_grid
from planner.profiler.prompt_loss_fit import bucket_low
from planner.validation_phases import PHASE_TITLES, PhaseRow
from planner.validation_steps import measured_decode_stretch

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
    phases: tuple[PhaseRow, ...] = ()  # where the run kept per-phase timings (`planner.validation_phases`)
    noise: dict[str, float | None] = field(default_factory=dict)  # latency key -> the measured one's sampling noise
    # the simulation's prompt steps by the decode batch beside them, as the measured ones are read
    # (`planner.validation_steps.simulated_prompt_stretch_by_decode_batch`)
    simulated_prompt_steps: dict[str, dict] = field(default_factory=dict)
    # and its decode steps without a join by batch, over the model and the served line
    # (`planner.validation_steps.simulated_decode_stretch_by_batch`)
    simulated_decode_steps: dict[str, dict] = field(default_factory=dict)

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


LATENCY_KEYS = tuple(key for key, _ in METRICS if key != "slo_attainment")


@dataclass(frozen=True)
class Verdict:
    """One workload shape on one topology, one model: how far the simulation was from the cluster."""

    shape: str
    topology: str
    model: str
    rates_to_knee: tuple[float, ...]  # the rates the latency errors are averaged over
    errors_to_knee: dict[str, float]  # latency key -> mean |relative error| over those rates
    measured_goodput: tuple[float, bool]  # (req/s, bracketed by the grid), `goodput_on_grid`
    simulated_goodput: tuple[float, bool]
    noise_to_knee: dict[str, float | None] = field(default_factory=dict)  # latency key -> mean sampling noise
    # latency key -> mean signed relative error over the same rates: + the simulator slower than the
    # cluster (pessimistic), - faster (optimistic); a mean |error| alone hides which
    bias_to_knee: dict[str, float] = field(default_factory=dict)

    @property
    def goodput_error(self) -> float | None:
        """(simulated - measured) / measured goodput; None when either is not bracketed by the grid
        (a bound: the cluster or the simulation met the target at no rate, or at every rate)."""
        (measured, measured_bracketed), (simulated, simulated_bracketed) = self.measured_goodput, self.simulated_goodput
        if not (measured_bracketed and simulated_bracketed) or measured <= 0:
            return None
        return (simulated - measured) / measured


def verdict(comparisons: Sequence[Comparison], shape: str, topology: str, model: str,
            target: float = 0.9) -> Verdict:
    """The verdict on `model`'s comparisons of one shape and topology. The rates up to the knee are
    those at or below the last rate whose measured attainment met `target` before any missed it
    (the lowest rate alone when none did). ValueError when `model` has no comparison."""
    rows = sorted((c for c in comparisons if c.model == model), key=lambda c: c.rate_rps)
    if not rows:
        raise ValueError(f"no comparison for model {model!r}")
    to_knee = rows[:rates_to_knee([c.measured["slo_attainment"] for c in rows], target)]
    errors = {key: sum(abs(c.error(key)) for c in to_knee) / len(to_knee) for key in LATENCY_KEYS}
    return Verdict(shape, topology, model, tuple(c.rate_rps for c in to_knee), errors,
                   goodput_on_grid([(c.rate_rps, c.measured["slo_attainment"]) for c in rows], target),
                   goodput_on_grid([(c.rate_rps, c.simulated["slo_attainment"]) for c in rows], target),
                   {key: _mean_known(c.noise.get(key) for c in to_knee) for key in LATENCY_KEYS},
                   {key: sum(c.error(key) for c in to_knee) / len(to_knee) for key in LATENCY_KEYS})


def rates_to_knee(attainments: Sequence[float], target: float = 0.9) -> int:
    """How many of the rates, lowest first, are up to the knee: those before the first whose
    attainment missed `target` (at least one: the lowest alone when it missed)."""
    met = next((i for i, attainment in enumerate(attainments) if attainment < target), len(attainments))
    return max(1, met)


def _mean_known(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def error_and_noise(error: float, noise: float | None, bias: float | None = None) -> str:
    """A mean |error| with, where known, the mean signed error and the measured percentile's
    sampling noise beside it: "15% (-12%, n 3%)"."""
    details = ([] if bias is None else [f"{bias:+.0%}"]) + ([] if noise is None else [f"n {noise:.0%}"])
    return f"{error:.0%}" + (f" ({', '.join(details)})" if details else "")


def verdict_table(verdicts: Sequence[Verdict], rates_by_run: dict[tuple[str, str], Sequence[float]]) -> Table:
    """Shape x topology rows: the mean |error| of each latency up to the knee, the goodputs and their error."""
    table = Table(title="per shape and topology: mean |error| up to the measured knee (signed: the mean error, + "
                        "the simulator pessimistic; n: the measured percentile's sampling noise), goodput measured vs "
                        "simulated")
    for name in ("shape", "topology", "model", "rates to knee"):
        table.add_column(name)
    for key, label in METRICS:
        if key in LATENCY_KEYS:
            table.add_column(label, justify="right")
    for name in ("goodput real / sim req/s", "goodput err"):
        table.add_column(name, justify="right")
    for v in verdicts:
        rates = rates_by_run.get((v.shape, v.topology), ())
        error = "-" if v.goodput_error is None else f"{v.goodput_error:+.0%}"
        table.add_row(v.shape, v.topology, v.model, ",".join(f"{r:g}" for r in v.rates_to_knee),
                      *(error_and_noise(v.errors_to_knee[key], v.noise_to_knee.get(key), v.bias_to_knee.get(key))
                        for key in LATENCY_KEYS),
                      f"{format_goodput(v.measured_goodput, rates)} / {format_goodput(v.simulated_goodput, rates)}", error)
    return table


def verdicts_to_json(verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    return [{"shape": v.shape, "topology": v.topology, "model": v.model, "rates_to_knee": list(v.rates_to_knee),
             "mean_abs_error_to_knee": v.errors_to_knee, "mean_error_to_knee": v.bias_to_knee,
             "mean_noise_to_knee": v.noise_to_knee,
             "goodput_rps": {"measured": v.measured_goodput[0], "measured_bracketed": v.measured_goodput[1],
                             "simulated": v.simulated_goodput[0], "simulated_bracketed": v.simulated_goodput[1]},
             "goodput_error": v.goodput_error} for v in verdicts]


def write_summary(out_dir: Path, verdicts: Sequence[Verdict],
                  rates_by_run: dict[tuple[str, str], Sequence[float]]) -> list[Path]:
    """summary.json (every verdict), summary.md (`verdict_table` as markdown) and summary.png under
    `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(verdicts_to_json(verdicts), indent=1))
    lines = ["| shape | topology | model | rates to knee | " + " | ".join(dict(METRICS)[k] for k in LATENCY_KEYS)
             + " | goodput real / sim req/s | goodput err |", "|---" * (6 + len(LATENCY_KEYS)) + "|"]
    for v in verdicts:
        rates = rates_by_run[(v.shape, v.topology)]
        errors = " | ".join(error_and_noise(v.errors_to_knee[k], v.noise_to_knee.get(k), v.bias_to_knee.get(k))
                            for k in LATENCY_KEYS)
        error = "-" if v.goodput_error is None else f"{v.goodput_error:+.0%}"
        lines.append(f"| {v.shape} | {v.topology} | {v.model} | {','.join(f'{r:g}' for r in v.rates_to_knee)} | "
                     f"{errors} | {format_goodput(v.measured_goodput, rates)} / "
                     f"{format_goodput(v.simulated_goodput, rates)} | {error} |")
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    png = plot_verdicts(verdicts, out_dir / "summary.png", "measured vs simulated, per shape and topology")
    return [out_dir / "summary.json", out_dir / "summary.md", png]


def error_table(comparisons: Sequence[Comparison], title: str) -> Table:
    """Each rate's metrics, measured / simulated (error; n: the measured percentile's sampling noise)."""
    table = Table(title=title)
    table.add_column("rate req/s", justify="right")
    table.add_column("model")
    for _, label in METRICS:
        table.add_column(f"{label} real / sim (err)", justify="right")
    hybrid = any(_local(c) for c in comparisons)
    if hybrid:
        table.add_column("local prefills real / sim", justify="right")
    for c in comparisons:
        cells = []
        for key, _ in METRICS:
            if key == "slo_attainment":
                cells.append(f"{c.measured[key]:.0%} / {c.simulated[key]:.0%} ({c.error(key) * 100:+.0f} pp)")
            else:
                noise = c.noise.get(key)
                cells.append(f"{c.measured[key]:.1f} / {c.simulated[key]:.1f} ({c.error(key):+.0%}"
                             + ("" if noise is None else f", n {noise:.0%}") + ")")
        if hybrid:
            cells.append(f"{c.measured[LOCAL]:.0%} / {c.simulated[LOCAL]:.0%}" if _local(c) else "-")
        table.add_row(f"{c.rate_rps:.2f}", c.model, *cells)
    for model in dict.fromkeys(c.model for c in comparisons):
        errors = mean_abs_errors(comparisons, model)
        cells = [f"{errors[key] * 100:.0f} pp" if key == "slo_attainment" else f"{errors[key]:.0%}" for key, _ in METRICS]
        table.add_row("mean |err|", model, *cells, *([""] if hybrid else []), style="bold")
    return table


def phase_table(comparisons: Sequence[Comparison], title: str) -> Table | None:
    """Each rate's phases (`planner.validation_phases`), measured / simulated p50 and p90 in ms with
    the error; None when no comparison has phases."""
    rows = [(c, row) for c in comparisons for row in c.phases]
    if not rows:
        return None
    table = Table(title=title)
    for column in ("rate req/s", "model", "phase", "p50 real / sim ms (err)", "p90 real / sim ms (err)"):
        table.add_column(column, justify="left" if column in ("model", "phase") else "right")
    for c, row in rows:
        cells = []
        for which in ("p50", "p90"):
            measured, simulated = getattr(row, f"measured_{which}_s"), getattr(row, f"simulated_{which}_s")
            error = row.error(which)
            cells.append("-" if measured is None or simulated is None else
                         f"{measured * 1e3:.1f} / {simulated * 1e3:.1f}" + ("" if error is None else f" ({error:+.0%})"))
        table.add_row(f"{c.rate_rps:.2f}", c.model, PHASE_TITLES[row.phase], *cells)
    return table


HANDOFF_PARTS = ("hops", "inside")
# the Decode call's way in alone, a median: measured from the prefill worker's join step to the
# decode worker's front end (`validation_joins.hop_in_s`), simulated as the hops (their median)
HOP_IN = "hop_in"


def measured_handoff_ms(measured: dict[str, Any]) -> dict[str, float] | None:
    """The handoff split a run's join trace measured (`planner.validation_joins`, under
    `engine_steps`): hops outside the decode workers and the time inside them, means in ms over
    their pulled requests (weighted by each worker's count), and where the prefill workers' joins
    matched them, the way in's median (`HOP_IN`; each worker's, weighted by its count); None where
    none was traced."""
    workers = [w.get("handoff", {}) for w in measured.get("engine_steps", {}).get("workers", {}).values()]
    workers = [h for h in workers if h.get("requests") and h.get("hops_ms") is not None]
    total = sum(h["requests"] for h in workers)
    if not total:
        return None
    split = {part: sum(h[f"{part}_ms"] * h["requests"] for h in workers) / total for part in HANDOFF_PARTS}
    matched = [h for h in workers if h.get("hop_in_requests")]
    if matched:
        split[HOP_IN] = sum(h["hop_in_ms"] * h["hop_in_requests"] for h in matched) / sum(
            h["hop_in_requests"] for h in matched)
    return split


def simulated_handoff_ms(simulated: dict[str, Any]) -> dict[str, float] | None:
    """The same split from the simulator's summary (`SimResult.handoff_split_ms`), `HOP_IN` its
    hops' median where it has one; None where no request pulled."""
    values = {part: simulated.get(f"mean_handoff_{part}_ms") for part in HANDOFF_PARTS}
    if any(v is None for v in values.values()):
        return None
    if simulated.get("median_handoff_hops_ms") is not None:
        values[HOP_IN] = simulated["median_handoff_hops_ms"]
    return values


def handoff_table(comparisons: Sequence[Comparison], title: str) -> Table | None:
    """Each rate's handoff split, measured (the join trace) / simulated in ms with the error (the
    way in where both sides have it); None when no run was traced."""
    rows = [(c, m, s) for c in comparisons
            if (m := measured_handoff_ms(c.measured)) is not None
            and (s := simulated_handoff_ms(c.simulated)) is not None]
    if not rows:
        return None
    parts = HANDOFF_PARTS + ((HOP_IN,) if any(HOP_IN in m and HOP_IN in s for _, m, s in rows) else ())
    titles = {"hops": "hops outside real / sim ms", "inside": "inside the decode worker real / sim ms",
              HOP_IN: "the way in, median, real / sim ms"}
    table = Table(title=title)
    for column in ("rate req/s", "model", *(titles[part] for part in parts)):
        table.add_column(column, justify="left" if column == "model" else "right")
    for c, measured, simulated in rows:
        cells = ["-" if part not in measured or part not in simulated else
                 f"{measured[part]:.1f} / {simulated[part]:.1f}"
                 + (f" ({(simulated[part] - measured[part]) / measured[part]:+.0%})" if measured[part] > 0 else "")
                 for part in parts]
        table.add_row(f"{c.rate_rps:.2f}", c.model, *cells)
    return table


def measured_prompt_stretch(measured: dict[str, Any]) -> dict[str, float]:
    """The prompt steps' median stretch by decode batch bucket from a run's traced prefill workers
    (`planner.validation_steps.prompt_stretch_by_decode_batch`, under `engine_steps`), each bucket's
    medians weighted by their workers' steps where there are several; {} where none was traced."""
    workers = measured.get("engine_steps", {}).get("prefill_workers", {}).values()
    sums: dict[str, list[float]] = {}
    for worker in workers:
        for label, row in worker.get("stretch_by_decode_batch", {}).items():
            total = sums.setdefault(label, [0.0, 0.0])
            total[0] += row["median_stretch"] * row["steps"]
            total[1] += row["steps"]
    return {label: weighted / steps for label, (weighted, steps) in sums.items() if steps}


def prompt_steps_compared(c: Comparison) -> dict[str, dict[str, float | None]]:
    """Each decode batch bucket either side has: the measured and the simulated prompt steps'
    median stretch over the model's step (None where that side has too few steps there); {} where
    the run traced no prefill worker."""
    simulated = {label: row["median_stretch"] for label, row in c.simulated_prompt_steps.items()}
    return _side_by_side(measured_prompt_stretch(c.measured), simulated)


def decode_steps_compared(c: Comparison) -> dict[str, dict[str, float | None]]:
    """Each batch bucket either side has: the decode steps without a join, measured and simulated,
    over the profile's model plus its served line (`validation_steps.measured_decode_stretch`,
    `simulated_decode_stretch_by_batch`; None where that side has too few steps); {} where the run
    traced no decode worker."""
    measured = measured_decode_stretch(c.measured.get("engine_steps", {}).get("workers", {}))
    return _side_by_side({label: row["stretch"] for label, row in measured.items()},
                         {label: row["stretch"] for label, row in c.simulated_decode_steps.items()})


def _side_by_side(measured: dict[str, float], simulated: dict[str, float]) -> dict[str, dict[str, float | None]]:
    if not measured:
        return {}
    labels = sorted({*measured, *simulated}, key=bucket_low)
    return {label: {"measured": measured.get(label), "simulated": simulated.get(label)} for label in labels}


def prompt_step_table(comparisons: Sequence[Comparison], title: str) -> Table | None:
    """Each rate's prompt steps by the decode batch beside them: measured / simulated median
    stretch over the model's step; None when no run traced its prefill workers."""
    return _bucket_table(comparisons, prompt_steps_compared, title)


def decode_step_table(comparisons: Sequence[Comparison], title: str) -> Table | None:
    """Each rate's decode steps without a join by batch: measured / simulated over the model plus
    the served line; None when no run traced its decode workers."""
    return _bucket_table(comparisons, decode_steps_compared, title)


def _bucket_table(comparisons: Sequence[Comparison], compared_of: Callable[[Comparison], dict],
                  title: str) -> Table | None:
    rows = [(c, compared) for c in comparisons if (compared := compared_of(c))]
    if not rows:
        return None
    labels = sorted({label for _, compared in rows for label in compared}, key=bucket_low)
    table = Table(title=title)
    for column in ("rate req/s", "model", *(f"batch {label}" for label in labels)):
        table.add_column(column, justify="left" if column == "model" else "right")
    cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for c, compared in rows:
        table.add_row(f"{c.rate_rps:.2f}", c.model,
                      *(f"{cell(compared[label]['measured'])} / {cell(compared[label]['simulated'])}"
                        if label in compared else "" for label in labels))
    return table


def to_json(comparisons: Sequence[Comparison]) -> dict[str, Any]:
    keys = [key for key, _ in METRICS]
    models = list(dict.fromkeys(c.model for c in comparisons))
    return {
        "metrics": keys,
        "runs": [{"rate_rps": c.rate_rps, "model": c.model,
                  "measured": {k: c.measured[k] for k in keys + _local(c)}, "simulated": {k: c.simulated[k] for k in keys + _local(c)},
                  "error": {k: c.error(k) for k in keys},
                  **({"noise": c.noise} if c.noise else {}),
                  **({"phases": [row.as_dict() for row in c.phases]} if c.phases else {}),
                  **({"handoff_ms": {"measured": m, "simulated": simulated_handoff_ms(c.simulated)}}
                     if (m := measured_handoff_ms(c.measured)) is not None else {}),
                  **({"prompt_stretch": p} if (p := prompt_steps_compared(c)) else {}),
                  **({"decode_stretch": d} if (d := decode_steps_compared(c)) else {})} for c in comparisons],
        "mean_abs_error": {m: mean_abs_errors(comparisons, m) for m in models},
    }


def _local(c: Comparison) -> list[str]:
    """["local_prefill_share"] where both sides have it (a hybrid's run since it was kept), else []."""
    return [LOCAL] if LOCAL in c.measured and LOCAL in c.simulated else []


LOCAL = "local_prefill_share"


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
    return save_figure(fig, path, title)


def plot_verdicts(verdicts: Sequence[Verdict], path: Path, title: str) -> Path:
    """Measured and simulated goodput side by side for each shape on each topology (one model:
    the first), and each latency's mean |error| up to the knee with its sampling noise (a tick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    first = verdicts[0].model
    rows = [v for v in verdicts if v.model == first]
    names = [f"{v.shape}\n{v.topology}" for v in rows]
    x = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(rows)) * 2, 4.6))
    left.bar(x - 0.2, [v.measured_goodput[0] for v in rows], 0.4, label="measured", color="black")
    left.bar(x + 0.2, [v.simulated_goodput[0] for v in rows], 0.4, label=f"simulated: {first}", color="tab:blue")
    left.set_ylabel("goodput (req/s at 90% attainment)")
    left.set_title("goodput (a bar at the grid's end is a bound)")
    width = 0.8 / len(LATENCY_KEYS)
    for i, key in enumerate(LATENCY_KEYS):
        label = dict(METRICS)[key]
        right.bar(x - 0.4 + (i + 0.5) * width, [100 * v.errors_to_knee[key] for v in rows], width, label=label)
        noise = [v.noise_to_knee.get(key) for v in rows]
        right.scatter([x[j] - 0.4 + (i + 0.5) * width for j, n in enumerate(noise) if n is not None],
                      [100 * n for n in noise if n is not None], marker="_", s=120, color="black",
                      label="the measured percentile's sampling noise" if i == 0 else None)
    right.axhline(10, color="gray", linestyle="--", linewidth=1, label="10% aim")
    right.set_ylabel("mean |error| up to the knee, %")
    right.set_title("latency error up to the measured knee")
    for ax in (left, right):
        ax.set_xticks(x, names, fontsize=8)
        ax.legend(fontsize=8)
    return save_figure(fig, path, title)


def save_figure(fig, path: Path, title: str) -> Path:
    """Titles, lays out, writes and closes a figure; returns `path`."""
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
