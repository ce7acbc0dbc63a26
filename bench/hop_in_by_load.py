"""The Decode call's way in (the prefill engine's step to the decode worker's front end) against the
load on the prefill core, over every kept validation: measured beside what a resimulation put, and
the processor-sharing form fitted on it (`planner.simulator.host.loaded_hop_stretch`).

    .venv/bin/python bench/resimulate_kept.py --variant current= --variant "loaded=--hops loaded" \\
        --out OUT                                                         # the resimulations (minutes)
    .venv/bin/python bench/hop_in_by_load.py --resimulated current=OUT/runs/current \\
        --resimulated loaded=OUT/runs/loaded [--out hop_in.md]

Each kept validation's 1P+1D rates that traced the way in (`handoff_ms.measured.hop_in`) give a
row: the measured median way in, the router's and the client's CPU (cores, by /proc) and the
prefill engine's busy share. Prints, per resimulation, the mean |error| and the signed error of its
way in by host kind and by shape; then the form 1 / (1 - a x (router + client cores) - b x prefill
busy) fitted on the first resimulation's way in, on all rows and with each host kind left out in
turn. Writes the same markdown to --out when given. Nothing runs on a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from resimulate_kept import KEPT, RESULTS  # noqa: E402  (beside this file)
from planner.simulator.host import MAX_STOLEN  # noqa: E402


@dataclass(frozen=True)
class HopRow:
    """One rate of one kept validation: its measured way in (ms) and the loads it ran under."""
    kept: str
    shape: str
    rate_rps: float
    measured_ms: float
    unbound_cores: float       # the router's and the client's CPU over the rate, in cores
    prefill_busy: float        # the share of the rate the prefill engine was stepping

    @property
    def kind(self) -> str:
        """The host kind, as the kept validations are named (`zen4-s69` -> `zen4`)."""
        return self.kept.split("-")[0]


def hop_rows(name: str, validation: dict) -> list[HopRow]:
    """The rows of one validation.json: its rates with a traced way in, the loads and the prefill
    engine's busy share read (`cpu_cores_by_process`, `engine_steps`). Pure."""
    rows = []
    for run in validation.get("runs", []):
        measured = (run.get("handoff_ms") or {}).get("measured") or {}
        rate = str(run["rate_rps"])
        by_process = (validation.get("cpu_cores_by_process") or {}).get(rate) or {}
        prefill = next(iter(((validation.get("engine_steps") or {}).get(rate, {}).get("prefill_workers") or {}).values()),
                       {})
        if measured.get("hop_in") is None or by_process.get("router") is None or prefill.get("busy_share") is None:
            continue
        rows.append(HopRow(name, validation.get("workload", {}).get("shape", "?"), run["rate_rps"], measured["hop_in"],
                           by_process["router"] + by_process.get("client", 0.0), prefill["busy_share"]))
    return rows


def simulated_hop_in(validation: dict) -> dict[float, float]:
    """Rate -> the simulated way in (ms) of a resimulated validation.json. Pure."""
    return {run["rate_rps"]: hop for run in validation.get("runs", [])
            if (hop := ((run.get("handoff_ms") or {}).get("simulated") or {}).get("hop_in")) is not None}


def fit_loss_weights(rows: Sequence[HopRow], simulated_ms: Sequence[float]) -> tuple[float, float]:
    """(a, b) of measured = simulated / (1 - a x unbound cores - b x prefill busy), least squares on
    1 - simulated / measured (no intercept: no load, no loss). Pure."""
    if len(rows) != len(simulated_ms) or len(rows) < 2:
        raise ValueError(f"need two or more rows, each with its simulated way in; got {len(rows)} and {len(simulated_ms)}")
    lost = np.array([1 - s / r.measured_ms for r, s in zip(rows, simulated_ms)])
    loads = np.array([[r.unbound_cores, r.prefill_busy] for r in rows])
    a, b = np.linalg.lstsq(loads, lost, rcond=None)[0]
    return float(a), float(b)


def stretched_ms(rows: Sequence[HopRow], simulated_ms: Sequence[float], a: float, b: float,
                 most: float = MAX_STOLEN) -> np.ndarray:
    """The simulated way in stretched by the fitted loss (at most `most` of the time). Pure."""
    lost = np.array([min(most, a * r.unbound_cores + b * r.prefill_busy) for r in rows])
    return np.array(simulated_ms) / (1 - lost)


def errors(measured_ms: Sequence[float], predicted_ms: Sequence[float]) -> tuple[float, float]:
    """(mean |error|, mean signed error) of the predictions, as fractions of the measured. Pure."""
    measured, predicted = np.array(measured_ms), np.array(predicted_ms)
    if not len(measured):
        return float("nan"), float("nan")
    relative = (predicted - measured) / measured
    return float(np.mean(np.abs(relative))), float(np.mean(relative))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--resimulated", action="append", required=True, metavar="NAME=DIR",
                   help="a resimulate_kept variant's runs directory (OUT/runs/<variant>); the first is fitted on")
    p.add_argument("--out", type=Path, help="also write the markdown here")
    return p.parse_args(argv)


def _pairs(directory: Path) -> tuple[list[HopRow], list[float]]:
    rows, simulated = [], []
    for kept in KEPT:
        for measured_path in sorted((RESULTS / kept.directory).glob("1P+1D/*/validation.json")):
            resimulated_path = directory / kept.name / "1P+1D" / measured_path.parent.name / "validation.json"
            if not resimulated_path.exists():
                continue
            sims = simulated_hop_in(json.loads(resimulated_path.read_text()))
            for row in hop_rows(kept.name, json.loads(measured_path.read_text())):
                if row.rate_rps in sims:
                    rows.append(row)
                    simulated.append(sims[row.rate_rps])
    return rows, simulated


def _error_lines(title: str, rows: list[HopRow], predicted: Sequence[float]) -> list[str]:
    lines = [f"\n{title}: mean |error| (signed)\n", "| rows | n | error |", "|---|---|---|"]
    groups = [("all", list(range(len(rows))))]
    groups += [(kind, [i for i, r in enumerate(rows) if r.kind == kind]) for kind in sorted({r.kind for r in rows})]
    groups += [(shape, [i for i, r in enumerate(rows) if r.shape == shape]) for shape in sorted({r.shape for r in rows})]
    for label, chosen in groups:
        size, signed = errors([rows[i].measured_ms for i in chosen], [predicted[i] for i in chosen])
        lines.append(f"| {label} | {len(chosen)} | {100 * size:.0f}% ({100 * signed:+.0f}%) |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines = ["# The way in against the prefill core's load (ms, measured against each resimulation)"]
    first: tuple[list[HopRow], list[float]] | None = None
    for item in args.resimulated:
        name, _, directory = item.partition("=")
        rows, simulated = _pairs(Path(directory))
        if not rows:
            raise SystemExit(f"{directory}: no resimulated kept validation with a traced way in")
        first = first or (rows, simulated)
        lines += _error_lines(name, rows, simulated)
    rows, simulated = first
    a, b = fit_loss_weights(rows, simulated)
    lines += [f"\nfitted on the first: a = {a:.3f} per core of router + client, b = {b:.3f} per prefill busy share",
              "\n| left out | n | a | b | error before | error fitted |", "|---|---|---|---|---|---|"]
    for kind in sorted({r.kind for r in rows}):
        train = [i for i, r in enumerate(rows) if r.kind != kind]
        test = [i for i, r in enumerate(rows) if r.kind == kind]
        ka, kb = fit_loss_weights([rows[i] for i in train], [simulated[i] for i in train])
        before = errors([rows[i].measured_ms for i in test], [simulated[i] for i in test])
        fitted = errors([rows[i].measured_ms for i in test],
                        stretched_ms([rows[i] for i in test], [simulated[i] for i in test], ka, kb))
        lines.append(f"| {kind} | {len(test)} | {ka:.3f} | {kb:.3f} | {100 * before[0]:.0f}% ({100 * before[1]:+.0f}%) "
                     f"| {100 * fitted[0]:.0f}% ({100 * fitted[1]:+.0f}%) |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
