"""Where the planner's optimism lives: every kept validation's signed errors by shape, load and
request phase, and whether the simulator reproduces each kept profile's own batched runs.

Over the kept validations the goodput error is a bias, not noise (BENCHMARKS, "Several profiles of
one VM, merged": signed +11-13%). A bias lives somewhere: in a shape, at light load or near the
knee, in a phase of the request (the router's queue, the prompt, the first gap, the steady gaps),
or inside the profile itself. This reads, with no cluster and in seconds:

- every kept validation (`bench/resimulate_kept.py`'s KEPT; its first profile's rows, as it was
  simulated then): per shape, the mean signed error of TTFT and TPOT p50/p90 at the lowest rate
  (30% of the predicted goodput) and at the other rates up to the knee (+: the simulator slower
  than the cluster, pessimistic; -: optimistic), and per phase the mean measured and simulated
  p50/p90 at the lowest rate;
- every kept profile's closure: each of its batched runs (`ServingCosts.served_batch_runs`: B
  requests of 128-token prompts sent at once, 256 tokens out) simulated through 1P+1D, the mean
  gap of the settled half of the steps all B decode against the run's measured mean gap (B over
  the tokens per second it received), by batch, with the served step as a line and as a table.
  What the simulator cannot reproduce of its own profile it cannot predict elsewhere.

    python bench/bias_by_shape.py --out bench/results/bias_by_shape

Writes OUT/bias_by_shape.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

PERCENTILES = ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms")
PHASES = ("queue", "prefill", "first_gap", "steady_gap")
KNEE_ATTAINMENT = 0.9
MIN_PHASE_MS = 1.0   # a phase measured below this (the router's queue at light load) has no ratio worth reading


def rows_to_knee(rows: Sequence[dict], target: float = KNEE_ATTAINMENT) -> list[dict]:
    """`rows` (one model's, any order) by rising rate up to and including the first whose measured
    attainment falls below `target` (all of them where none does)."""
    ordered, kept = sorted(rows, key=lambda r: r["rate_rps"]), []
    for row in ordered:
        kept.append(row)
        if row["measured"]["slo_attainment"] < target:
            break
    return kept


def signed_errors(rows: Sequence[dict], keys: Sequence[str] = PERCENTILES) -> dict[str, list[float]]:
    """simulated / measured - 1 for each of `keys` in each row where both are known and measured > 0."""
    out: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key in keys:
            measured, simulated = row["measured"].get(key), row["simulated"].get(key)
            if measured and simulated is not None:
                out[key].append(simulated / measured - 1)
    return dict(out)


def phase_means(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per phase and quantile (p50, p90), the mean measured and simulated ms over `rows`' phase
    tables and the mean signed error of those above `MIN_PHASE_MS` measured (None where the mean
    measured is below it: the router's queue at light load, whose few readable rows would say
    nothing of the rest)."""
    seen: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        for phase in row.get("phases") or ():
            for q in ("p50", "p90"):
                measured, simulated = phase.get(f"measured_{q}_ms"), phase.get(f"simulated_{q}_ms")
                if measured is not None and simulated is not None:
                    seen[(phase["phase"], q)].append((measured, simulated))
    out: dict[str, dict[str, float]] = {}
    for (phase, q), pairs in seen.items():
        measured = statistics.mean(m for m, _ in pairs)
        readable = [s / m - 1 for m, s in pairs if m >= MIN_PHASE_MS] if measured >= MIN_PHASE_MS else []
        out[f"{phase} {q}"] = {"measured_ms": measured, "simulated_ms": statistics.mean(s for _, s in pairs),
                               "n": len(pairs), "signed_error": statistics.mean(readable) if readable else None}
    return out


def mean_gap_s(step_s: Sequence[float], weight: Sequence[int], batch: int) -> float | None:
    """The mean of the settled half of the steps every one of `batch` requests decoded in (a
    simulation's `itl_step_s` and `itl_weight`): the window a batched run's gap is read over."""
    full = [s for s, w in zip(step_s, weight) if w == batch]
    settled = full[len(full) // 2:]
    return statistics.mean(settled) if settled else None


@dataclass(frozen=True)
class Closure:
    profile: str
    host_kind: str
    served_step: str
    batch: int
    measured_ms: float    # the runs' mean gap: batch / tokens per second, over the runs of this batch
    simulated_ms: float

    @property
    def error(self) -> float:
        return self.simulated_ms / self.measured_ms - 1


def closure(path: Path, label: str) -> list[Closure]:
    """The profile at `path` simulated on its own batched runs, by batch, line and table."""
    from loadgen.workload import RequestSpec
    from planner.perf_model import fit_perf_model
    from planner.profile import load_profile
    from planner.profiler.stream_fit import BATCH_OUTPUT_TOKENS, BATCH_PROMPT_TOKENS
    from planner.simulator import SimSettings, Topology, simulate

    profile = load_profile(path)
    runs = profile.serving.served_batch_runs
    if not runs:
        return []
    model, settings, out = fit_perf_model(profile).model, SimSettings.from_profile(profile), []
    for served_step in ("line", "table"):
        for batch in sorted({int(run[0]) for run in runs}):
            requests = [RequestSpec(0.0, BATCH_PROMPT_TOKENS, BATCH_OUTPUT_TOKENS) for _ in range(batch)]
            result = simulate(requests, Topology.disaggregated(1, 1), replace(settings, served_step=served_step), model)
            simulated = mean_gap_s(result.itl_step_s, result.itl_weight, batch)
            measured = statistics.mean(batch / run[3] for run in runs if int(run[0]) == batch)
            if simulated is not None:
                out.append(Closure(label, profile.hardware.host_kind, served_step, batch, measured * 1e3, simulated * 1e3))
    return out


def by_shape(validations: Sequence[tuple[str, Path]]) -> dict:
    """Signed percentile errors per shape at the lowest rate and up to the knee, and the phases at
    the lowest rate, over every validation.json under each directory."""
    low: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    knee: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    phase_rows: dict[str, list[dict]] = defaultdict(list)
    for _, directory in validations:
        for path in sorted(directory.glob("*/*/validation.json")):
            data = json.loads(path.read_text())
            runs = data.get("runs") or []
            if not runs:
                continue
            shape, first = data["workload"].get("shape", "uniform"), runs[0]["model"]
            rows = rows_to_knee([r for r in runs if r["model"] == first])
            for key, values in signed_errors(rows[:1]).items():
                low[shape][key] += values
            for key, values in signed_errors(rows[1:]).items():
                knee[shape][key] += values
            phase_rows[shape].append(rows[0])
    mean = lambda values: statistics.mean(values) if values else None  # noqa: E731
    return {shape: {"lowest_rate": {k: mean(v) for k, v in low[shape].items()},
                    "to_knee": {k: mean(v) for k, v in knee[shape].items()},
                    "validations": len(phase_rows[shape]),
                    "phases_lowest_rate": phase_means(phase_rows[shape])} for shape in sorted(phase_rows)}


def closure_summary(closures: Sequence[Closure]) -> dict:
    """Per served-step form and batch: the mean and median signed error and how many profiles."""
    grouped: dict[tuple[str, int], list[float]] = defaultdict(list)
    for c in closures:
        grouped[(c.served_step, c.batch)].append(c.error)
    return {f"{form} b{batch}": {"mean": statistics.mean(v), "median": statistics.median(v), "profiles": len(v),
                                 "worst": max(v, key=abs)}
            for (form, batch), v in sorted(grouped.items())}


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def markdown(shapes: dict, closures: dict) -> str:
    lines = ["| shape | validations | lowest rate: TTFT p50 / p90 | TPOT p50 / p90 | to the knee: TTFT p50 / p90 "
             "| TPOT p50 / p90 |", "|---|---:|---|---|---|---|"]
    for shape, s in shapes.items():
        lo, kn = s["lowest_rate"], s["to_knee"]
        lines.append(f"| {shape} | {s['validations']} | {pct(lo.get('median_ttft_ms'))} / {pct(lo.get('p90_ttft_ms'))} "
                     f"| {pct(lo.get('median_tpot_ms'))} / {pct(lo.get('p90_tpot_ms'))} "
                     f"| {pct(kn.get('median_ttft_ms'))} / {pct(kn.get('p90_ttft_ms'))} "
                     f"| {pct(kn.get('median_tpot_ms'))} / {pct(kn.get('p90_tpot_ms'))} |")
    lines += ["", "| shape | phase at the lowest rate | measured ms | simulated ms | mean signed error |",
              "|---|---|---:|---:|---:|"]
    for shape, s in shapes.items():
        for name in (f"{p} {q}" for p in PHASES for q in ("p50", "p90")):
            if row := s["phases_lowest_rate"].get(name):
                lines.append(f"| {shape} | {name} | {row['measured_ms']:.2f} | {row['simulated_ms']:.2f} "
                             f"| {pct(row['signed_error'])} |")
    lines += ["", "| served step, batch | profiles | mean signed error | median | worst |", "|---|---:|---:|---:|---:|"]
    for key, c in closures.items():
        lines.append(f"| {key} | {c['profiles']} | {pct(c['mean'])} | {pct(c['median'])} | {pct(c['worst'])} |")
    return "\n".join(lines) + "\n"


def plot(shapes: dict, closures: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = list(shapes)
    width = 0.1
    for i, (where, key) in enumerate((w, k) for w in ("lowest_rate", "to_knee") for k in PERCENTILES):
        values = [100 * (shapes[s][where].get(key) or 0.0) for s in names]
        left.bar([j + (i - 3.5) * width for j in range(len(names))], values, width,
                 label=f"{key.replace('_ms', '').replace('median', 'p50')} ({where.replace('_', ' ')})",
                 hatch="" if where == "lowest_rate" else "//")
    left.axhline(0, color="k", lw=0.8)
    left.set_xticks(range(len(names)), names)
    left.set_ylabel("simulated / measured - 1 (%): below 0 optimistic")
    left.set_title("kept validations: signed error by shape")
    left.legend(fontsize=7, ncol=2)
    for form, marker in (("line", "o"), ("table", "s")):
        keys = [k for k in closures if k.startswith(form)]
        right.plot([int(k.rsplit(" b", 1)[1]) for k in keys], [100 * closures[k]["mean"] for k in keys], marker=marker,
                   label=f"{form}: mean")
        right.plot([int(k.rsplit(" b", 1)[1]) for k in keys], [100 * closures[k]["median"] for k in keys], marker=marker,
                   ls=":", label=f"{form}: median")
    right.axhline(0, color="k", lw=0.8)
    right.set_xscale("log", base=2)
    right.set_xlabel("batch of the profile's batched run")
    right.set_ylabel("simulated / measured mean gap - 1 (%)")
    right.set_title("each kept profile simulated on its own batched runs")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from resimulate_kept import KEPT, RESULTS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "out" / "bias_by_shape", help="output directory")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = by_shape([(k.name, RESULTS / k.directory) for k in KEPT])
    profiles = dict.fromkeys(k.profile for k in KEPT)
    closures = closure_summary([c for profile in profiles for c in closure(RESULTS / profile, profile)])
    (args.out / "bias_by_shape.json").write_text(json.dumps({"by_shape": shapes, "closure": closures,
                                                             "profiles": list(profiles)}, indent=1))
    table = markdown(shapes, closures)
    (args.out / "bias_by_shape.md").write_text(table)
    plot(shapes, closures, args.out / "bias_by_shape.png")
    print(table)
    print(f"wrote {args.out}/bias_by_shape.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
