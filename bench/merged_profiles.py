"""Does the median of a session's profiles predict its validations better than any one of them?

Within one session on one VM, two or three profiles measured tens of minutes apart put the same
validation's goodput 4-53% apart (BENCHMARKS: "On a Zen 3 EPYC again", "A prompt step beside decode
streams"): the profile's own minutes, not the model. Here every kept validation whose session
measured several profiles of its host (SETS; --set adds one) is resimulated by
`bench/validate_planner.py --resimulate` with each profile alone and with their median
(`planner.profile_merge.merged_profile`, what `pdserve profile --merge` writes), and the errors are
set side by side: per validation and shape, each profile's goodput error; per set, each profile's
mean |goodput error| over the rows whose goodput both sides bracket, the mean |error| of the
latency percentiles up to the knee (TTFT and TPOT, p50 and p90), and the rows whose simulated goodput
exceeds the measured by more than 10% (an optimistic plan).

    python bench/merged_profiles.py --out bench/results/merged_profiles

A repeated validation's passes (run1, run2, ...) are each a validation. Writes OUT/<set>/merged.json
(the median profile), OUT/<set>/<validation>/ (the resimulations), OUT/merged_profiles.{json,md,png}.
Nothing runs on a cluster: seconds a validation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
OPTIMISTIC = 0.10   # a simulated goodput above the measured by more than this is an optimistic row
PERCENTILES = ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms")


@dataclass(frozen=True)
class SessionSet:
    """One session's validations (directories under bench/results, each one pass) and the profiles
    that session measured of its host, in the order measured; the first is the one the
    validations were planned with."""

    name: str
    validations: tuple[str, ...]
    profiles: tuple[str, ...]
    transport: str = "shm"


SETS = (
    SessionSet("zen3-s66", ("validate_zen3_s66/tiny",),
               ("validate_zen3_s66/tiny_zen3.json", "validate_zen3_s66/tiny_zen3_a.json",
                "validate_zen3_s66/tiny_zen3_b.json")),
    SessionSet("zen4-s67", ("validate_zen4_s67/first", "validate_zen4_s67/second"),
               ("validate_zen4_s67/tiny_zen4.json", "validate_zen4_s67/tiny_zen4_b.json",
                "validate_zen4_s67/tiny_zen4_c.json")),
    SessionSet("zen4-s63", tuple(f"repeats_zen4_s63/refined/run{k}" for k in (1, 2, 3)),
               ("repeats_zen4_s63/tiny_zen4_s63.json", "repeats_zen4_s63/tiny_zen4_s63b.json")),
    SessionSet("amx167-s62", tuple(f"repeats_amx167/refined/run{k}" for k in (1, 2, 3)),
               ("repeats_amx167/tiny_amx167_s62.json", "repeats_amx167/tiny_amx167_s62b.json")),
    SessionSet("zen4-hops", ("hops_zen4/tiny",), ("hops_zen4/tiny_zen4.json", "hops_zen4/tiny_zen4_b.json")),
    SessionSet("zen5-shm", ("validate_shapes_zen5_shm/tiny",),
               ("validate_shapes_zen5_shm/tiny_2cpu_epyc_avx512_corun_served.json",
                "validate_shapes_zen5_shm/tiny_2cpu_epyc_avx512_corun_served_later.json")),
    SessionSet("zen4-s68", ("validate_zen4_s68/tiny",),
               ("validate_zen4_s68/tiny_zen4_p1.json", "validate_zen4_s68/tiny_zen4_p2.json",
                "validate_zen4_s68/tiny_zen4_p3.json")),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALIDATION[,...]:PROFILE,PROFILE[,...]",
                   help="another session's validations and profiles (paths under bench/results or absolute), "
                        "e.g. zen4-s69=/tmp/v:/tmp/p1.json,/tmp/p2.json; repeat for several")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="only these sets (default: all)")
    p.add_argument("--out", type=Path, default=REPO / "out" / "merged_profiles")
    return p.parse_args(argv)


def set_arg(text: str) -> SessionSet:
    name, _, rest = text.partition("=")
    validations, _, profiles = rest.partition(":")
    if not name or not validations or len(profiles.split(",")) < 2:
        raise SystemExit(f"--set {text!r}: NAME=VALIDATION[,...]:PROFILE,PROFILE[,...] (two profiles or more)")
    return SessionSet(name, tuple(validations.split(",")), tuple(profiles.split(",")))


def resolved(path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else RESULTS / path


def main(argv: list[str] | None = None) -> int:
    from planner.profile import load_profile, save_profile
    from planner.profile_merge import merged_profile

    args = parse_args(argv)
    sets = [s for s in (*SETS, *(set_arg(t) for t in args.set)) if not args.only or s.name in args.only]
    rows = []
    for session in sets:
        merged_path = args.out / session.name / "merged.json"
        merged_path.parent.mkdir(parents=True, exist_ok=True)
        save_profile(merged_profile([load_profile(resolved(p)) for p in session.profiles]), merged_path)
        profiles = [resolved(p) for p in session.profiles] + [merged_path]
        for validation in session.validations:
            out = args.out / session.name / validation.replace("/", "_")
            command = [sys.executable, str(REPO / "bench" / "validate_planner.py"), "--resimulate",
                       str(resolved(validation)), "--transport", session.transport, "--out-dir", str(out)]
            for profile in profiles:
                command += ["--profile", str(profile)]
            print(f"{session.name}: {validation} with {len(profiles)} profiles", flush=True)
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            rows += verdict_rows(session, validation, out, [p.stem for p in profiles])
    table = by_profile(rows)
    write(args.out, rows, table)
    return 0


def verdict_rows(session: SessionSet, validation: str, out: Path, stems: list[str]) -> list[dict]:
    """One row per shape and profile of one resimulated validation: its goodput error (None where a
    side's goodput is past the grid) and its percentiles' mean |error| up to the knee."""
    summary = out / "summary.json"   # written for a validation of several shapes, as every kept one is
    if not summary.exists():
        raise SystemExit(f"{summary} is missing: {validation} is not a validation of several shapes")
    verdicts = json.loads(summary.read_text())
    rows = []
    for v in verdicts:
        goodput = v["goodput_rps"]
        bracketed = goodput["measured_bracketed"] and goodput["simulated_bracketed"]
        errors = v["mean_abs_error_to_knee"]
        rows.append({"set": session.name, "validation": validation, "shape": v["shape"],
                     "profile": "merged" if v["model"] == "merged" else f"p{stems.index(v['model']) + 1}",
                     "profile_file": v["model"], "goodput_error": v["goodput_error"] if bracketed else None,
                     "goodput_measured": goodput["measured"], "goodput_simulated": goodput["simulated"],
                     "percentile_error": (sum(errors[p] for p in PERCENTILES) / len(PERCENTILES)
                                          if all(errors.get(p) is not None for p in PERCENTILES) else None)})
    return rows


def by_profile(rows: list[dict]) -> list[dict]:
    """Per set and profile: the mean |goodput error| over the rows every profile of the set brackets,
    the mean percentile error, the optimistic rows; then each set's singles taken together."""
    table = []
    for name in dict.fromkeys(row["set"] for row in rows):
        of_set = [row for row in rows if row["set"] == name]
        cases = dict.fromkeys((row["validation"], row["shape"]) for row in of_set)
        shared = [case for case in cases
                  if all(row["goodput_error"] is not None for row in of_set if (row["validation"], row["shape"]) == case)]
        for profile in dict.fromkeys(row["profile"] for row in of_set):
            mine = [row for row in of_set if row["profile"] == profile]
            goodput = [abs(row["goodput_error"]) for row in mine if (row["validation"], row["shape"]) in shared]
            pct = [row["percentile_error"] for row in mine if row["percentile_error"] is not None]
            table.append({"set": name, "profile": profile, "file": mine[0]["profile_file"],
                          "rows": len(goodput), "mean_abs_goodput_error": mean(goodput),
                          "max_abs_goodput_error": max(goodput) if goodput else None,
                          "mean_percentile_error": mean(pct),
                          "optimistic_rows": sum(1 for row in mine if row["goodput_error"] is not None
                                                 and row["goodput_error"] > OPTIMISTIC),
                          "past_grid_rows": sum(1 for row in mine if row["goodput_error"] is None)})
    return table


def pooled(rows: list[dict]) -> dict:
    """Over every validation and shape that each profile of its set brackets: the single profiles'
    rows taken together against the merged ones (mean |error|, mean signed error), and in how many
    cases the merged error is within the singles' range, below their mean |error|, below their worst."""
    cases: dict[tuple, list[dict]] = {}
    for row in rows:
        cases.setdefault((row["set"], row["validation"], row["shape"]), []).append(row)
    shared = [case for case in cases.values() if all(row["goodput_error"] is not None for row in case)]
    singles = [row["goodput_error"] for case in shared for row in case if row["profile"] != "merged"]
    merged = [row["goodput_error"] for case in shared for row in case if row["profile"] == "merged"]
    below_mean = below_worst = 0
    for case in shared:
        own = [abs(row["goodput_error"]) for row in case if row["profile"] != "merged"]
        mine = next(abs(row["goodput_error"]) for row in case if row["profile"] == "merged")
        below_mean += mine < sum(own) / len(own)
        below_worst += mine < max(own)
    return {"cases": len(shared), "single_rows": len(singles),
            "single_mean_abs": mean([abs(e) for e in singles]), "single_mean_signed": mean(singles),
            "merged_mean_abs": mean([abs(e) for e in merged]), "merged_mean_signed": mean(merged),
            "merged_below_singles_mean_abs": below_mean, "merged_below_worst_single": below_worst}


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def write(out: Path, rows: list[dict], table: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    over_all = pooled(rows)
    (out / "merged_profiles.json").write_text(json.dumps({"rows": rows, "by_profile": table, "pooled": over_all},
                                                         indent=1))
    pct = lambda x: "-" if x is None else f"{x:+.0%}"   # noqa: E731
    absolute = lambda x: "-" if x is None else f"{x:.1%}"   # noqa: E731
    lines = ["| set | profile | rows | mean abs goodput err | max | mean percentile err | optimistic rows | past the grid |",
             "|---|---|---|---|---|---|---|---|"]
    for t in table:
        name = "**merged**" if t["profile"] == "merged" else f"{t['profile']} ({t['file']})"
        lines.append(f"| {t['set']} | {name} | {t['rows']} | {absolute(t['mean_abs_goodput_error'])} | "
                     f"{absolute(t['max_abs_goodput_error'])} | {absolute(t['mean_percentile_error'])} | "
                     f"{t['optimistic_rows']} | {t['past_grid_rows']} |")
    lines += ["", f"Over the {over_all['cases']} validations and shapes that every profile of its set brackets: "
              f"single profiles {absolute(over_all['single_mean_abs'])} mean |goodput error| "
              f"({pct(over_all['single_mean_signed'])} signed, {over_all['single_rows']} rows), merged "
              f"{absolute(over_all['merged_mean_abs'])} ({pct(over_all['merged_mean_signed'])} signed); the merged "
              f"error below its singles' mean |error| in {over_all['merged_below_singles_mean_abs']}, below the worst "
              f"single's in {over_all['merged_below_worst_single']}.",
              "", "Goodput error by validation and shape (each profile, then merged):", "",
              "| set | validation | shape | goodput measured | errors |", "|---|---|---|---|---|"]
    for key in dict.fromkeys((r["set"], r["validation"], r["shape"]) for r in rows):
        mine = [r for r in rows if (r["set"], r["validation"], r["shape"]) == key]
        errors = " / ".join(pct(r["goodput_error"]) for r in mine)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {mine[0]['goodput_measured']:.2f} | {errors} |")
    (out / "merged_profiles.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out / "merged_profiles.png", table)


def plot(path: Path, table: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(t["set"] for t in table))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(sets)), 4.0))
    width = 0.2
    for i, name in enumerate(sets):
        mine = [t for t in table if t["set"] == name]
        for j, t in enumerate(mine):
            value = t["mean_abs_goodput_error"] or 0.0
            merged = t["profile"] == "merged"
            ax.bar(i + (j - (len(mine) - 1) / 2) * width, 100 * value, width * 0.9,
                   color="tab:green" if merged else "tab:gray", edgecolor="black" if merged else "none")
    ax.axhline(10, color="tab:red", linestyle="--", linewidth=1, label="the aim: 10%")
    ax.set_xticks(range(len(sets)), sets, rotation=20)
    ax.set_ylabel("mean |goodput error|, %")
    ax.set_title("each session's profiles alone (grey, in the order measured) and their median (green)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
