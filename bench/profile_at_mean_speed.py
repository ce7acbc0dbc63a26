"""Do two profiles of one VM agree point by point once each point is moved to its profile's mean
interpreter speed? And how far does that move a profile's fits?

    python bench/profile_at_mean_speed.py --profile A.json --profile B.json \\
        --elasticity 0,0.25,0.5,0.75,1 --out out/point_speed

A shared VM runs Python 1.3-1.8x slower for seconds at a time, and each of a profile's decode
rows and batched runs lands in whichever second it ran in. A profile taken since the rows kept
their times (`DecodeSample.start_s`, `ServingCosts.served_batch_windows_s`, beside
`HardwareInfo.machine_interp_series_ms`) can move each to its mean speed
(`planner.profiler.point_speed`: step / ratio ** e, e the elasticity, in logs). For each
elasticity this prints and writes (out/agreement.{json,md,png}):

- each profile's decode fit error (MAPE) with its rows moved, and its served step (the line, and
  the extra over the engine at each batch, fitted again from its moved runs);
- with two profiles of the same plan: how far their decode rows stand apart, row by row (mean
  |A / B - 1|), and their fits over the rows' points, and their served extras by batch; the
  elasticity at which they agree best is the one the VM's steps followed.

With --write E each profile moved at elasticity E is written as out/<name>_at_mean_e<E>.json, to
resimulate a validation with (`bench/validate_planner.py --resimulate DIR --profile ...`). Seconds;
nothing is run but the fits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from planner.perf_model import fit_perf_model
from planner.profile import Profile, load_profile, save_profile
from planner.profiler.point_speed import SpeedSeries, profile_at_mean_speed, rows_at_mean_speed


def describe(profile: Profile, elasticity: float, served_elasticity: float | None) -> dict:
    """One profile at one elasticity: its decode fit's MAPE, its served line and extras, its rows' steps."""
    moved = profile_at_mean_speed(profile, elasticity, served_elasticity)
    fit = fit_perf_model(moved)
    serving = moved.serving
    return {"elasticity": elasticity, "decode_mape": round(fit.decode_mape, 4),
            "served_line_ms": [round(serving.decode_step_s * 1e3, 3), round(serving.decode_cpu_s_per_token * 1e6, 1)],
            "served_extra_ms": {f"{batch:g}": round(extra * 1e3, 3) for batch, extra in serving.served_step_extra_s},
            "steps_ms": [round(row.step_s * 1e3, 4) for row in moved.decode],
            "fitted_ms": [round(fit.model.decode_step_s(row.batch_size, row.context_tokens) * 1e3, 4)
                          for row in profile.decode]}


def mean_apart(a: list[float], b: list[float]) -> float:
    """Mean |a / b - 1| over matched values (0.0 where none)."""
    pairs = [(x, y) for x, y in zip(a, b) if y > 0]
    return statistics.fmean(abs(x / y - 1) for x, y in pairs) if pairs else 0.0


def agreement(first: dict, second: dict) -> dict:
    """How far two profiles' descriptions at one elasticity stand apart."""
    batches = sorted(set(first["served_extra_ms"]) & set(second["served_extra_ms"]), key=float)
    return {"rows_apart": round(mean_apart(first["steps_ms"], second["steps_ms"]), 4),
            "fits_apart": round(mean_apart(first["fitted_ms"], second["fitted_ms"]), 4),
            "served_extra_apart_ms": round(statistics.fmean(
                abs(first["served_extra_ms"][b] - second["served_extra_ms"][b]) for b in batches), 3) if batches else None}


def same_plan(first: Profile, second: Profile) -> bool:
    return [row.batch_size for row in first.decode] == [row.batch_size for row in second.decode]


def report(paths: list[Path], elasticities: list[float], served_elasticity: float | None) -> dict:
    profiles = [load_profile(path) for path in paths]
    for path, profile in zip(paths, profiles):
        if SpeedSeries.of(profile.hardware) is None or not any(row.timed for row in profile.decode):
            raise SystemExit(f"{path}: the profile kept no interpreter series or no row times; take it again with "
                             "this pdserve's `pdserve profile`")
    out = {"profiles": [str(path) for path in paths], "served_elasticity": served_elasticity, "by_elasticity": []}
    for profile, path in zip(profiles, paths):
        _, ratios = rows_at_mean_speed(profile.decode, SpeedSeries.of(profile.hardware), 1.0)
        known = [r for r in ratios if r is not None]
        out.setdefault("row_ratios", {})[path.stem] = [min(known), max(known)] if known else None
    for e in elasticities:
        described = [describe(profile, e, served_elasticity) for profile in profiles]
        entry = {"elasticity": e, "profiles": described}
        if len(profiles) == 2 and same_plan(*profiles):
            entry["agreement"] = agreement(*described)
        out["by_elasticity"].append(entry)
    return out


def markdown(result: dict) -> str:
    names = [Path(p).stem for p in result["profiles"]]
    lines = ["| elasticity | " + " | ".join(f"{n}: decode MAPE, served line (ms + us/seq)" for n in names)
             + (" | rows apart | fits apart | served extras apart (ms) |" if "agreement" in result["by_elasticity"][0]
                else " |"),
             "|---|" + "---|" * len(names) + ("---|---|---|" if "agreement" in result["by_elasticity"][0] else "")]
    for entry in result["by_elasticity"]:
        cells = [f"{d['decode_mape']:.1%}, {d['served_line_ms'][0]:.2f} + {d['served_line_ms'][1]:.0f}"
                 for d in entry["profiles"]]
        agree = entry.get("agreement")
        tail = (f" | {agree['rows_apart']:.1%} | {agree['fits_apart']:.1%} | {agree['served_extra_apart_ms']} |"
                if agree else " |")
        lines.append(f"| {entry['elasticity']:g} | " + " | ".join(cells) + tail)
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = result["by_elasticity"]
    es = [entry["elasticity"] for entry in entries]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, name in enumerate(Path(p).stem for p in result["profiles"]):
        left.plot(es, [entry["profiles"][i]["decode_mape"] * 100 for entry in entries], "o-", label=f"{name}: fit MAPE")
    if "agreement" in entries[0]:
        left.plot(es, [entry["agreement"]["rows_apart"] * 100 for entry in entries], "s--", label="rows apart")
        left.plot(es, [entry["agreement"]["fits_apart"] * 100 for entry in entries], "^--", label="fits apart")
    left.set_xlabel("elasticity of the step to the interpreter")
    left.set_ylabel("%")
    left.set_title("decode table at the profile's mean speed")
    left.legend(fontsize=8)
    if len(result["profiles"]) == 2:
        first, last = entries[0], entries[-1]
        a0, b0 = first["profiles"][0]["steps_ms"], first["profiles"][1]["steps_ms"]
        a1, b1 = last["profiles"][0]["steps_ms"], last["profiles"][1]["steps_ms"]
        right.scatter(a0, b0, s=12, label=f"as read (e {first['elasticity']:g})")
        right.scatter(a1, b1, s=12, marker="x", label=f"moved (e {last['elasticity']:g})")
        top = max(a0 + b0 + a1 + b1)
        right.plot([0, top], [0, top], "k:", linewidth=0.8)
        right.set_xlabel(f"{Path(result['profiles'][0]).stem}: decode row (ms)")
        right.set_ylabel(f"{Path(result['profiles'][1]).stem}: same row (ms)")
        right.set_title("row by row")
        right.legend(fontsize=8)
    else:
        right.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, action="append", required=True,
                        help="a profile that kept its rows' times; twice to set two of one VM side by side")
    parser.add_argument("--elasticity", default="0,0.25,0.5,0.75,1",
                        help="comma-separated elasticities of the step to the interpreter to try (0: as read)")
    parser.add_argument("--served-elasticity", type=float, default=None,
                        help="the batched runs' elasticity (default: each --elasticity, as the rows')")
    parser.add_argument("--write", type=float, default=None, metavar="E",
                        help="also write each profile moved at elasticity E as <out>/<name>_at_mean_e<E>.json")
    parser.add_argument("--out", type=Path, required=True, help="directory for agreement.{json,md,png}")
    args = parser.parse_args(argv)
    if len(args.profile) > 2:
        parser.error("--profile: one or two")
    try:
        elasticities = [float(e) for e in args.elasticity.split(",")]
    except ValueError:
        parser.error(f"--elasticity: comma-separated numbers, got {args.elasticity!r}")
    if any(e < 0 for e in elasticities):
        parser.error("--elasticity: each >= 0")
    result = report(args.profile, elasticities, args.served_elasticity)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agreement.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "agreement.md").write_text(table)
    plot(result, args.out / "agreement.png")
    print(table, end="")
    for name, span in result["row_ratios"].items():
        if span:
            print(f"{name}: its rows ran at {span[0]:.2f}-{span[1]:.2f}x its mean interpreter time")
    if args.write is not None:
        for path in args.profile:
            out = args.out / f"{path.stem}_at_mean_e{args.write:g}.json"
            save_profile(profile_at_mean_speed(load_profile(path), args.write, args.served_elasticity), out)
            print(f"wrote {out}")
    print(f"wrote {args.out}/agreement.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
