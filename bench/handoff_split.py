"""Where each handoff went, run beside run: the join trace's split of the first gap (hops outside the
decode worker, and inside it the step running when the request came, the pull and the steps it
spanned, the join step) beside the simulator's, and the TPOT both put, from validations made with
`bench/validate_planner.py --step-trace`.

    .venv/bin/python bench/handoff_split.py --run "vLLM's order=DIR_A" --run "early pull=DIR_B" \\
        [--out table.md]

Each DIR is a validation's output directory; every validation.json under it is read (one per
shape and topology). Prints one markdown table (milliseconds; "pull 2 steps" is the share of
pulled requests whose pull was reported two steps after the scheduler took them in; "way in", the
Decode call's from the prefill step's end to the decode worker's front end, medians) and writes it
to --out when given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLUMNS = ("run", "shape", "req/s", "first gap", "hops real / sim", "way in real / sim", "inside real / sim", "behind step",
           "pull", "pull 2+ steps", "join step", "TPOT p50 real / sim")


def rows_of(name: str, validation: dict) -> list[tuple]:
    """One row per traced rate of one validation.json (its first profile's simulation)."""
    shape = validation.get("workload", {}).get("shape", "?")
    steps = validation.get("engine_steps", {})
    model = validation["runs"][0]["model"] if validation.get("runs") else None
    rows = []
    for run in validation.get("runs", []):
        if run["model"] != model or "handoff_ms" not in run:
            continue
        workers = steps.get(str(run["rate_rps"]), {}).get("workers", {})   # keyed as validate_planner writes it
        traced = [w["handoff"] for w in workers.values() if w.get("handoff", {}).get("requests")]
        if not traced:
            continue
        h = max(traced, key=lambda t: t["requests"])
        shares = h["pull_steps_share"]
        measured, simulated = run["handoff_ms"]["measured"], run["handoff_ms"]["simulated"] or {}
        rows.append((name, shape, f"{run['rate_rps']:.2f}", f"{h.get('client_first_gap_ms', float('nan')):.1f}",
                     f"{measured['hops']:.1f} / {simulated.get('hops', float('nan')):.1f}",
                     "-" if "hop_in" not in measured else
                     f"{measured['hop_in']:.1f} / {simulated.get('hop_in', float('nan')):.1f}",
                     f"{measured['inside']:.1f} / {simulated.get('inside', float('nan')):.1f}",
                     f"{h['behind_step_ms']:.1f}", f"{h['pull_ms']:.1f}", f"{shares['2'] + shares['3+']:.0%}",
                     f"{h['join_step_ms']:.1f}",
                     f"{run['measured']['median_tpot_ms']:.1f} / {run['simulated']['median_tpot_ms']:.1f}"))
    return rows


def table(rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="NAME=DIR",
                        help="a name for the run and a validate_planner --step-trace output directory")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.run:
        name, _, directory = spec.partition("=")
        files = sorted(Path(directory).rglob("validation.json"))
        if not files:
            raise SystemExit(f"no validation.json under {directory}")
        for path in files:
            rows += rows_of(name, json.loads(path.read_text()))
    if not rows:
        raise SystemExit("no traced handoffs in these runs (validate_planner --step-trace keeps them)")
    text = table(rows)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
