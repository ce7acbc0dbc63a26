"""Which phase a simulator change moves: per validation, shape and phase, the mean |error| of the
simulated p50 against the measured one, side by side for two or more resimulations of the same runs.

    python bench/phase_errors.py --run before=out/resim_before --run after=out/resim_after \\
        --out bench/results/phase_errors

Each --run NAME=DIR is a `bench/validate_planner.py --resimulate` output (DIR/<topology>/<shape>/
validation.json, or DIR/<validation>/<topology>/<shape>/validation.json for several validations
resimulated into one folder each). A request's phases (`planner.validation_phases`: prefill with
its hops, the first gap at the handoff, the steady decode gap) are compared per rate; the error of
a phase is the mean over the rates of |simulated p50 / measured p50 - 1|. The queue is left out:
measured, it misses the wait behind a running step, which lands in the measured prefill (that
module's note), so its relative error says nothing; where a queue forms, compare TTFT. Writes
phase_errors.{json,md,png}: one row per validation, topology and shape, one column per phase and
run, and the mean of each column.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PHASES = ("prefill", "first_gap", "steady_gap")  # planner.validation_phases.PHASES but the queue


def rate_errors(runs: list[dict], phase: str) -> list[float]:
    """|simulated / measured - 1| of `phase`'s p50 at each rate of one validation.json's `runs`
    where both sides have it (a measured p50 of 0 or none: left out)."""
    errors = []
    for run in runs:
        for row in run.get("phases", []):
            measured, simulated = row.get("measured_p50_ms"), row.get("simulated_p50_ms")
            if row["phase"] == phase and measured and simulated is not None:
                errors.append(abs(simulated / measured - 1))
    return errors


def phase_errors(validation: dict) -> dict[str, float | None]:
    """phase -> the mean over the rates of its p50's relative error (None: no rate has it)."""
    return {phase: statistics.mean(e) if (e := rate_errors(validation["runs"], phase)) else None
            for phase in PHASES}


def collect(root: Path) -> dict[str, dict[str, float | None]]:
    """'<validation/>topology/shape' -> `phase_errors` for every validation.json below `root`."""
    return {str(path.parent.relative_to(root)): phase_errors(json.loads(path.read_text()))
            for path in sorted(root.glob("**/validation.json"))}


def table(runs: dict[str, dict[str, dict[str, float | None]]]) -> list[dict]:
    """One row per key every run has, in order: its key and, per phase and run, the error."""
    keys = [key for key in next(iter(runs.values())) if all(key in errors for errors in runs.values())]
    return [{"key": key, **{f"{phase}:{name}": errors[key][phase] for phase in PHASES for name, errors in runs.items()}}
            for key in keys]


def column_means(rows: list[dict]) -> dict[str, float | None]:
    columns = [column for column in rows[0] if column != "key"] if rows else []
    return {column: statistics.mean(values) if (values := [r[column] for r in rows if r[column] is not None]) else None
            for column in columns}


def markdown(rows: list[dict], names: list[str]) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    head = ["validation / topology / shape"] + [f"{phase} ({' / '.join(names)})" for phase in PHASES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in [*rows, {"key": "**mean**", **column_means(rows)}]:
        cells = [row["key"]] + [" / ".join(fmt(row[f"{phase}:{name}"]) for name in names) for phase in PHASES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = column_means(rows)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([p + i * width for p in range(len(PHASES))], [(means[f"{phase}:{name}"] or 0) * 100 for phase in PHASES],
               width, label=name)
    ax.set_xticks([p + width * (len(names) - 1) / 2 for p in range(len(PHASES))], PHASES)
    ax.set(ylabel="mean |error| of the p50 (%)",
           title=f"per-phase error over {len(rows)} validated shapes and topologies")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="NAME=DIR",
                        help="a resimulation to compare, named (repeat: two or more)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.run:
        name, sep, folder = item.partition("=")
        if not sep or not name or not Path(folder).is_dir():
            parser.error(f"--run takes NAME=DIR with DIR a folder, got {item!r}")
        runs[name] = collect(Path(folder))
        if not runs[name]:
            parser.error(f"no validation.json below {folder}")
    rows, names = table(runs), list(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "phase_errors.json").write_text(json.dumps({"runs": dict(zip(names, args.run)), "rows": rows,
                                                           "means": column_means(rows)}, indent=1))
    (args.out / "phase_errors.md").write_text(markdown(rows, names))
    plot(rows, names, args.out / "phase_errors.png")
    print(markdown(rows, names))
    print(f"wrote {args.out}/phase_errors.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
