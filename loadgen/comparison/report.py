"""The results of a comparison: tables (rich and markdown), <label>.json, <label>.md and PNG
plots under the config's out_dir. Paths in the JSON are recorded relative to the current
directory (the repository root, where the benchmarks run) so a result file does not carry the
machine it ran on."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from loadgen.comparison.admission import describe_refusals, refusals_by
from loadgen.comparison.goodput import (NOISY_OTHER_CORES, Measurement, Skipped, SLOPair, attainment_curves, best_vllm,
                                        format_goodput, goodputs, is_noisy, is_vllm, quiet_runs, ratio)
from loadgen.comparison.host_speed import speed_factors, speed_summary
from loadgen.metrics import PHASES, tpot_s
from loadgen.plots import plot_latency_cdfs  # also selects matplotlib's Agg backend

SYSTEM_LABELS = {"A": "A: vLLM colocated", "B": "B: pdserve 1P+1D", "B-tcp": "B-tcp: pdserve 1P+1D, KV over tcp",
                 "B-hybrid": "B-hybrid: pdserve 1P+1D hybrid, SLO placement", "B-agg": "B-agg: pdserve aggregated",
                 "B-slo": "B-slo: pdserve 1P+1D, SLO admission",
                 "C": "C: 2 x 1-core vLLM, round robin"}




def system_label(system: str) -> str:
    """The legend of a system; A-<n> is vLLM with --max-num-batched-tokens n."""
    if system.startswith("A-") and system[2:].isdigit():
        return f"{system}: vLLM colocated, max_num_batched_tokens {system[2:]}"
    if system.startswith("B*-"):
        pair, _, variant = system[3:].partition("-")
        return (f"{system}: pdserve as `pdserve plan` picked for the {pair} SLO pair"
                + (f", variant {variant}" if variant else ""))
    return SYSTEM_LABELS.get(system, system)


# -------------------------------------------------------------------------------------- tables


def goodput_rows(found: dict[str, dict[str, tuple[float, bool]]], pairs: Sequence[SLOPair],
                 rates: Sequence[float], systems: Sequence[str] = ("A", "B")) -> tuple[list[str], list[list[str]]]:
    """Per SLO pair: each system's goodput, then each other system's ratio to A ("not measured"
    for a system without any run, e.g. skipped for time). With A-<n> systems (vLLM's
    max_num_batched_tokens sweep) also A*, the best of the vLLM systems under that pair, and each
    pdserve system's ratio to it."""
    others = [s for s in systems if s != "A"]
    swept = any(s.startswith("A-") for s in systems)
    ours = [s for s in systems if not is_vllm(s)] if swept else []
    headers = ["SLO pair", *(f"{s} goodput (req/s)" for s in systems), *(["A* (best vLLM)"] if swept else []),
               *(f"{s} / A" for s in others), *(f"{s} / A*" for s in ours)]
    rows = []
    for p in pairs:
        by_system = dict(found[p.name])
        cells = [format_goodput(by_system[s], rates) if s in by_system else "not measured" for s in systems]
        best = best_vllm(by_system) if swept else None
        star = [f"{format_goodput(best[1], rates)} ({best[0]})" if best else "not measured"] if swept else []
        if best is not None:
            by_system["A*"] = best[1]
        rows.append([f"{p.name}: {p.describe()}", *cells, *star, *(_ratio_cell(by_system, s) for s in others),
                     *(_ratio_cell(by_system, s, "A*") for s in ours)])
    return headers, rows


def plan_rows(found: dict[str, dict[str, tuple[float, bool]]], predicted: Mapping[str, tuple[str, str, float, str]],
              rates: Sequence[float]) -> tuple[list[str], list[list[str]]]:
    """Each planned system (`predicted`: key -> (SLO pair, the plan's topology, predicted goodput,
    why the plan's request set is not the run's, or "")) against its goodput measured under the
    pair it was planned for, and the error of the plan (none for a plan of another request set)."""
    headers = ["system", "planned for", "topology", "predicted (req/s)", "measured (req/s)", "error"]
    rows = []
    for key, (pair, topology, predicted_rps, mismatch) in predicted.items():
        measured = found.get(pair, {}).get(key)
        error = "n/a"
        if mismatch:
            error = f"n/a ({mismatch})"
        elif measured is not None and measured[0] > 0:
            error = f"{(predicted_rps - measured[0]) / measured[0]:+.0%}" + ("" if measured[1] else " (bound)")
        rows.append([key, pair, topology, f"{predicted_rps:.2f}",
                     format_goodput(measured, rates) if measured is not None else "not measured", error])
    return headers, rows


def _ratio_cell(by_system: dict[str, tuple[float, bool]], system: str, baseline: str = "A") -> str:
    if baseline not in by_system or system not in by_system:
        return "n/a"
    (x, x_exact), (a, a_exact) = by_system[system], by_system[baseline]
    r = ratio(x, a)
    return "n/a" if r is None else f"{r:.2f}" + ("" if x_exact and a_exact else " (bound)")


def per_rate_rows(measurements: Sequence[Measurement], pairs: Sequence[SLOPair]) -> tuple[list[str], list[list[str]]]:
    headers = ["rate (req/s)", "system", "sent", "ok/failed/timeout", "refused (by)",
               *(f"attain {p.name}" for p in pairs), "TTFT p50 ms", "TTFT p90 ms", "TPOT p50 ms", "TPOT p90 ms", "machine speed", "other cores"]
    rows = []
    ordered = sorted(measurements, key=lambda m: (m.rate_rps, m.system))
    factors = speed_factors([m.host_ms_per_product for m in ordered])
    for m, factor in zip(ordered, factors):
        s = m.summaries[pairs[0].name]
        rows.append([f"{m.rate_rps:g}", m.system, str(s["num_prompts"]),
                     f"{s['completed']}/{s['failed'] - s['timed_out']}/{s['timed_out']}",
                     _refused_cell(m),
                     *(f"{m.summaries[p.name]['slo_attainment']:.0%}" for p in pairs),
                     f"{s['median_ttft_ms']:.0f}", f"{s['p90_ttft_ms']:.0f}", f"{s['median_tpot_ms']:.1f}",
                     f"{s['p90_tpot_ms']:.1f}", speed_cell(factor),
                     f"{m.other_load_cores:.2f}{_notes(m)}"])
    return headers, rows


def _refused_cell(m: Measurement) -> str:
    """How many of the run's requests were refused, and by which SLO where its router counted them."""
    records = m.result.records if m.result is not None else ()
    return describe_refusals(sum(r.status == "refused" for r in records), refusals_by(m.admission))


def speed_cell(factor: float | None) -> str:
    """A run's machine speed against the run's median, as its table shows it ("-": not checked)."""
    return "-" if factor is None else f"x{factor:.2f}"


def machine_speed_line(measurements: Sequence[Measurement]) -> str:
    """The report's line on the machine's speed before each run (`host_speed.speed_summary`)."""
    ordered = sorted(measurements, key=lambda m: (m.rate_rps, m.system))
    return speed_summary([m.host_ms_per_product for m in ordered], [f"{m.system} @ {m.rate_rps:g}" for m in ordered])


def _notes(m: Measurement) -> str:
    notes = [("noisy: not used for goodput", is_noisy(m)), ("restarted", m.restarted),
             (f"attempt {m.attempts}", m.attempts > 1)]
    return "".join(f" ({text})" for text, applies in notes if applies)


def phase_rows(measurements: Sequence[Measurement], pair: str) -> tuple[list[str], list[list[str]]]:
    """pdserve's own per-phase breakdown (means and p90s, ms) at each rate, per pdserve system,
    with the CPU the producer's KV server threads spent per MiB it served."""
    headers = ["rate (req/s)", "system", "prefill mean", "prefill p90", "KV transfer mean", "KV transfer p90",
               "decode mean", "KV MiB / request", "producer KV CPU ms / MiB", "TTFT p90 (client)"]
    rows = []
    for m in sorted((m for m in measurements if m.system.startswith("B")), key=lambda m: (m.rate_rps, m.system)):
        s = m.summaries[pair]
        if "mean_prefill_ms" not in s:
            continue
        rows.append([f"{m.rate_rps:g}", m.system, f"{s['mean_prefill_ms']:.0f}", f"{s['p90_prefill_ms']:.0f}",
                     f"{s['mean_kv_transfer_ms']:.0f}", f"{s['p90_kv_transfer_ms']:.0f}", f"{s['mean_decode_ms']:.0f}",
                     f"{s['mean_kv_transfer_bytes'] / 2**20:.1f}", _cpu_ms_per_mib(m, s), f"{s['p90_ttft_ms']:.0f}"])
    return headers, rows


def _cpu_ms_per_mib(m: Measurement, summary: dict) -> str:
    """The producer's KV-serving CPU over the MiB the run's requests moved (the run's few uncounted
    warm-up requests add their CPU but not their bytes: a slight overestimate)."""
    moved_mib = summary["total_kv_transfer_bytes"] / 2**20
    if m.kv_producer_cpu_s is None or moved_mib <= 0:
        return "-"
    return f"{m.kv_producer_cpu_s * 1e3 / moved_mib:.2f}"


def skipped_rows(skipped: Sequence[Skipped]) -> tuple[list[str], list[list[str]]]:
    return ["rate (req/s)", "system", "reason"], [[f"{s.rate_rps:g}", s.system, s.reason] for s in skipped]


def rich_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# -------------------------------------------------------------------------------------- output


def report(config, measurements: Sequence[Measurement], console: Console, wall_s: float, argv: Sequence[str],
           skipped: Sequence[Skipped] = (), predicted: Mapping[str, tuple[str, str, float, str]] | None = None) -> None:
    """Print the tables; write <label>.json, <label>.md and the PNGs under config.out_dir. Points
    skipped or cut for time are listed in all three. `predicted`: the planned systems' predictions
    (`plan_rows`), set beside what was measured."""
    pairs, rates = config.slo_pairs, config.rates_rps
    found = goodputs(measurements, pairs, config.attainment_target)
    sections = [("Goodput (>= 90% of requests within both SLOs)", goodput_rows(found, pairs, rates, config.systems)),
                ("Per run", per_rate_rows(measurements, pairs)),
                ("pdserve's per-phase breakdown (ms)", phase_rows(measurements, pairs[0].name))]
    if predicted:
        sections.insert(1, ("The plan's goodput against the measured", plan_rows(found, predicted, rates)))
    if skipped:
        sections.append(("Not measured (time budget)", skipped_rows(skipped)))
    for title, (headers, rows) in sections:
        console.print(rich_table(title, headers, rows))
    noisy = [m for m in measurements if is_noisy(m)]
    speed = machine_speed_line(measurements)
    console.print(f"wall time {wall_s / 60:.1f} min; {len(noisy)} of {len(measurements)} runs noisy "
                  f"(other processes > {NOISY_OTHER_CORES} cores); {len(skipped)} points skipped for time\n{speed}")
    config.out_dir.mkdir(parents=True, exist_ok=True)
    paths = [_write_json(config, measurements, found, wall_s, argv, skipped),
             _write_markdown(config, sections, wall_s, noisy, skipped, speed)]
    paths += [plot_attainment(config, measurements, p, found[p.name]) for p in pairs]
    paths += _plot_cdfs(config, measurements)
    console.print("wrote " + ", ".join(str(p) for p in paths))


def _recordable(value: Any) -> Any:
    """A config value as the JSON records it: paths relative to the current directory."""
    if isinstance(value, Path):
        here = Path.cwd()
        absolute = value if value.is_absolute() else here / value
        return str(absolute.relative_to(here)) if absolute.is_relative_to(here) else str(value)
    return value if isinstance(value, (int, float, tuple, type(None))) else str(value)


def _write_json(config, measurements, found, wall_s: float, argv: Sequence[str], skipped: Sequence[Skipped]):
    payload = {
        "command": " ".join(argv), "wall_s": wall_s, "cpu_count": os.cpu_count(),
        "config": {k: _recordable(v) for k, v in asdict(config).items()},
        "slo_pairs": {p.name: p.slo.as_ms() for p in config.slo_pairs},
        "goodput_rps": {pair: {s: {"goodput_rps": g, "bracketed": b} for s, (g, b) in by_system.items()}
                        for pair, by_system in found.items()},
        "ratio_b_over_a": {pair: _ratio(v, "B") for pair, v in found.items()},
        "ratios_over_a": {pair: {s: _ratio(v, s) for s in config.systems if s != "A"} for pair, v in found.items()},
        "skipped_for_time": [asdict(s) for s in skipped],
        "runs": [_run_json(m) for m in measurements],
    }
    path = config.out_dir / f"{config.label}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def _ratio(by_system: dict[str, tuple[float, bool]], system: str) -> float | None:
    both = "A" in by_system and system in by_system
    return ratio(by_system[system][0], by_system["A"][0]) if both else None


def _run_json(m: Measurement) -> dict[str, Any]:
    records = m.result.records
    return {"system": m.system, "rate_rps": m.rate_rps, "other_load_cores": m.other_load_cores,
            "host_ms_per_product": m.host_ms_per_product, "host_product": m.host_product,
            "host_wake_us": m.host_wake_us, "restarted": m.restarted, "attempts": m.attempts,
            "summaries": m.summaries, "admission": [asdict(s) for s in m.admission],
            "requests": {"status": [r.status for r in records], "error": [r.error for r in records],
                         "prompt_tokens": [r.prompt_tokens for r in records],
                         "output_tokens": [r.output_tokens for r in records],
                         "ttft_s": [r.ttft_s for r in records], "tpot_s": [tpot_s(r) for r in records],
                         "e2el_s": [r.e2el_s for r in records], "sent_s": [r.sent_s for r in records],
                         **{f"{phase}_s": [getattr(r.phases, f"{phase}_s", None) for r in records] for phase in PHASES}}}


def _write_markdown(config, sections, wall_s: float, noisy: Sequence[Measurement], skipped: Sequence[Skipped],
                    speed: str):
    parts = [f"_{wall_s / 60:.1f} min (budget {config.budget_s / 60:g} min); {len(noisy)} noisy runs "
             f"(other processes > {NOISY_OTHER_CORES} cores); {len(skipped)} points skipped for time_", f"_{speed}_"]
    parts += [f"**{title}**\n\n{markdown_table(headers, rows)}" for title, (headers, rows) in sections]
    path = config.out_dir / f"{config.label}.md"
    path.write_text("\n\n".join(parts) + "\n")
    return path


def plot_attainment(config, measurements, pair: SLOPair, found: dict[str, tuple[float, bool]]):
    """Attainment vs rate per system: quiet runs as a line (the goodput's input), noisy runs as x."""
    fig, ax = plt.subplots(figsize=(8, 5))
    quiet = attainment_curves(quiet_runs(measurements), pair.name)
    for system, points in sorted(quiet.items()):
        label = system_label(system)
        line, = ax.plot(*zip(*points), marker="o", label=label)
        noisy = [(m.rate_rps, m.summaries[pair.name]["slo_attainment"]) for m in measurements
                 if m.system == system and is_noisy(m) and (m.rate_rps, m.summaries[pair.name]["slo_attainment"]) not in points]
        if noisy:
            ax.scatter(*zip(*noisy), marker="x", s=60, color=line.get_color(), label=f"{label}: noisy run (not used)")
        goodput_rps = found[system][0]
        if goodput_rps:
            ax.axvline(goodput_rps, color=line.get_color(), linestyle=":", label=f"{label} goodput {goodput_rps:.2f} req/s")
    ax.axhline(config.attainment_target, color="red", linestyle="--", label=f"target {config.attainment_target:.0%}")
    ax.set(xlabel="offered rate (req/s)", ylabel="SLO attainment", ylim=(0, 1.05),
           title=f"{pair.name} SLOs: {pair.describe()}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    path = config.out_dir / f"{config.label}_attainment_{pair.name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_cdfs(config, measurements) -> list:
    paths = []
    tight = config.slo_pairs[0].slo
    for rate in config.cdf_rates_rps:
        at_rate = sorted((m for m in measurements if m.rate_rps == rate), key=lambda m: m.system)  # A first
        runs = {system_label(m.system): m.result.records for m in at_rate}
        if runs:
            paths.append(plot_latency_cdfs(runs, config.out_dir / f"{config.label}_cdf_{rate:g}rps.png", tight))
    return paths


def past_knee_run_json(m: Measurement, pair: str, misses) -> dict[str, Any]:
    """One run of a past-the-knee benchmark (bench/overload.py, bench/calibration_warmup.py) as its
    JSON keeps it: the run's conditions, its summary under `pair`, the router's calibration through
    it and the admitted misses beside it (None: the system has no admission calibration)."""
    return {"system": m.system, "rate_rps": m.rate_rps, "other_load_cores": m.other_load_cores,
            "host_ms_per_product": m.host_ms_per_product, "attempts": m.attempts,
            "summary": {k: v for k, v in m.summaries[pair].items() if not isinstance(v, dict)},
            "admission": [asdict(s) for s in m.admission],
            "admitted_misses": None if misses is None else [asdict(miss) for miss in misses]}


def plot_past_knee(points, pair: str, path: Path, title: str, labels: Mapping[str, str] | None = None,
                   marker_lines: Sequence[float] = (), xlabel: str = "offered rate (req/s)", connect: bool = True) -> Path:
    """Good req/s and attainment among the admitted against the offered rate, one series per
    system (`loadgen.comparison.overload.OverloadPoint`s); dotted verticals at `marker_lines`
    (the knee and its multiples), the 90% line, the legend under both panels."""
    fig, (good, admitted) = plt.subplots(1, 2, figsize=(12, 4.5))
    for system in sorted({p.system for p in points}):
        own = [p for p in points if p.system == system]
        label = (labels or {}).get(system, system_label(system))
        style = "o-" if connect else "o"
        good.plot([p.rate_rps for p in own], [p.good_rps for p in own], style, label=label, alpha=0.85)
        admitted.plot([p.rate_rps for p in own], [p.admitted_attainment if p.admitted_attainment is not None else 0
                                                  for p in own], style, label=label, alpha=0.85)
    for axis in (good, admitted):
        for rate in marker_lines:
            axis.axvline(rate, color="grey", linestyle=":", linewidth=0.8)
        axis.set_xlabel(xlabel)
    good.set_ylabel(f"good req/s ({pair} SLO pair)")
    admitted.set_ylabel("SLO attainment among admitted requests")
    admitted.axhline(0.9, color="black", linewidth=0.8)
    admitted.set_ylim(0, 1.05)
    handles, names = good.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", fontsize=8, ncol=1 if max(map(len, names), default=0) > 50 else 2)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05 + 0.04 * len(names), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

