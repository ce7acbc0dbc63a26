"""Every kept cross-shape validation resimulated with today's simulator, under one or more what-ifs.

A change to the simulator's host model has to hold on the host kinds it was not made on. The
validations kept under bench/results (real clusters' requests and measurements, each beside the
profile of its own session's host) are resimulated by `bench/validate_planner.py --resimulate` with
each variant's flags, and the errors set side by side: per validation, the mean |error| over its
rows' latency percentiles up to the knee (TTFT and TPOT, p50 and p90), the mean |goodput error| of
the rows whose goodput both sides bracket, and how many rows the simulator's goodput exceeds the
measured by more than 10% (an optimistic plan: the direction a planner must not err in).

    python bench/resimulate_kept.py --variant current= \\
        --variant "spill=--client-placement wake" --out out/resimulated_kept

Writes OUT/runs/<variant>/<validation>/ (the resimulations), OUT/resimulated_kept.{json,md,png}.
Nothing is run on a cluster: a few seconds a validation.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
OPTIMISTIC = 0.10   # a simulated goodput above the measured by more than this is an optimistic row


@dataclass(frozen=True)
class Kept:
    """A kept validation: its directory (topology/shape/validation.json under it), the profile of
    its session's host, and the transport it ran over."""
    name: str
    directory: str
    profile: str
    transport: str


KEPT = (
    Kept("amx-tcp", "validate_shapes_amx", "validate_shapes_amx/tiny_2cpu_amx_served.json", "tcp"),
    Kept("amx-shm", "validate_shapes_amx_shm/tiny", "validate_shapes_amx_shm/tiny_2cpu_amx_served.json", "shm"),
    Kept("amx167-shm", "validate_shapes_amx167_shm/tiny", "validate_shapes_amx167_shm/tiny_2cpu_amx167_served.json",
         "shm"),
    Kept("amx167-shm-bench", "validate_shapes_amx167_shm/bench",
         "validate_shapes_amx167_shm/bench_2cpu_amx167_served.json", "shm"),
    Kept("avx2-tcp", "validate_shapes_avx2/tiny", "validate_shapes_avx2/tiny_2cpu_epyc_avx2_router_served.json", "tcp"),
    Kept("epyc-tcp", "validate_shapes_epyc/tiny", "validate_shapes_epyc/tiny_2cpu_epyc_avx512_served.json", "tcp"),
    Kept("amx167-steps", "engine_steps_amx167/tiny_1P+1D", "engine_steps_amx167/tiny_2cpu_amx167_steps_served.json",
         "shm"),
    Kept("amx167-handoff", "handoff_amx167/tiny", "handoff_amx167/tiny_2cpu_amx167.json", "shm"),
    Kept("amx167-handoff-bench", "handoff_amx167/bench", "handoff_amx167/bench_2cpu_amx167_traced.json", "shm"),
    Kept("zen4-handoff", "handoff_zen4/tiny_1P+1D_vllm_order", "handoff_zen4/tiny_2cpu_zen4.json", "shm"),
    Kept("zen4-hops", "hops_zen4/tiny", "hops_zen4/tiny_zen4.json", "shm"),
    Kept("zen4-hops-bench", "hops_zen4/bench", "hops_zen4/bench_zen4.json", "shm"),
    Kept("zen4-corun", "corun_traced_zen4/tiny_validation", "corun_traced_zen4/tiny_zen4.json", "shm"),
    Kept("amx167-cores-1", "client_share_amx167/run1", "client_share_amx167/tiny_2cpu_amx167_served.json", "shm"),
    Kept("amx167-cores-2", "client_share_amx167/run2", "client_share_amx167/tiny_2cpu_amx167_served.json", "shm"),
    Kept("amx167-cores-3", "client_share_amx167/run3", "client_share_amx167/tiny_2cpu_amx167_wake.json", "shm"),
    Kept("amx167-cores-bench", "client_share_amx167/bench_run", "client_share_amx167/bench_2cpu_amx167_wake.json",
         "shm"),
    *(Kept(f"amx167-refined-{k}", f"repeats_amx167/refined/run{k}", "repeats_amx167/tiny_amx167_s62b.json", "shm")
      for k in (1, 2, 3)),
    *(Kept(f"zen4-s63-refined-{k}", f"repeats_zen4_s63/refined/run{k}", "repeats_zen4_s63/tiny_zen4_s63b.json", "shm")
      for k in (1, 2, 3)),
    *(Kept(f"zen4-s64-refined-{k}", f"repeats_zen4_s64/refined/run{k}", "repeats_zen4_s64/tiny_zen4_s64b.json", "shm")
      for k in (1, 2)),
    *(Kept(f"zen5-s65-refined-{k}", f"validate_zen5_s65/tiny/run{k}", "validate_zen5_s65/tiny_zen5.json", "shm")
      for k in (1, 2)),
    Kept("zen5-s65-bench", "validate_zen5_s65/bench", "validate_zen5_s65/bench_zen5.json", "shm"),
    Kept("zen3-s66", "validate_zen3_s66/tiny", "validate_zen3_s66/tiny_zen3.json", "shm"),
    Kept("zen4-s67-first", "validate_zen4_s67/first", "validate_zen4_s67/tiny_zen4.json", "shm"),
    Kept("zen4-s67-second", "validate_zen4_s67/second", "validate_zen4_s67/tiny_zen4_c.json", "shm"),
    Kept("zen4-s68", "validate_zen4_s68/tiny", "validate_zen4_s68/tiny_zen4_p1.json", "shm"),
    Kept("zen4-s68-bench", "validate_zen4_s68/bench", "validate_zen4_s68/bench_zen4.json", "shm"),
    Kept("zen4-s69", "served_corun_zen4_s69/tiny", "served_corun_zen4_s69/tiny_p1.json", "shm"),
    Kept("amx167-s70", "join_warmup_amx167_s70/tiny", "join_warmup_amx167_s70/tiny_p1.json", "shm"),
    Kept("amx167-s70-second", "join_warmup_amx167_s70/tiny3", "join_warmup_amx167_s70/tiny_p3.json", "shm"),
    Kept("zen3-s71", "validate_zen3_s71/tiny", "validate_zen3_s71/tiny_p1.json", "shm"),
    Kept("zen3-s72", "validate_zen3_s72/tiny", "validate_zen3_s72/tiny_p1.json", "shm"),
    Kept("amx167-s73", "validate_amx167_s73/tiny", "validate_amx167_s73/tiny_p1.json", "shm"),
    # the same runs with a profile of the same VM 20 minutes after them, the first kept with the idle
    # prompt row (`serving.prompt_idle_loss`): what the simulator charges as measured
    Kept("amx167-s73-p2", "validate_amx167_s73/tiny", "validate_amx167_s73/tiny_p2.json", "shm"),
    Kept("amx167-s73-second", "validate_amx167_s73/second/tiny", "validate_amx167_s73/second/tiny_p3.json", "shm"),
)
PERCENTILES = ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, metavar="NAME=FLAGS",
                   help="a name and the what-if flags of bench/validate_planner.py it resimulates with "
                        "(NAME= for the simulator's defaults); repeat to set several side by side")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help=f"resimulate only this kept validation; repeat for several (all: {[k.name for k in KEPT]})")
    p.add_argument("--out", type=Path, default=REPO / "out" / "resimulated_kept", help="output directory")
    return p.parse_args(argv)


def variants_of(specs: list[str]) -> dict[str, list[str]]:
    """NAME=FLAGS strings as {name: flags}; a name twice or without "=" is refused."""
    variants: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, flags = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variant {spec!r}: give NAME=FLAGS (FLAGS may be empty)")
        if name in variants:
            raise SystemExit(f"--variant {name!r} given twice")
        variants[name] = shlex.split(flags)
    return variants


def score(rows: list[dict]) -> dict:
    """One validation's rows (`bench/validate_planner.py`'s summary.json) in a few numbers: the mean
    |error| over every latency percentile of every row, the mean |goodput error| over the rows both
    sides bracket, and the rows whose simulated goodput is optimistic by more than `OPTIMISTIC`
    (the measured bracketed; a simulated one past the grid counts at the grid's top, a lower bound)."""
    errors = [abs(row["mean_abs_error_to_knee"][key]) for row in rows for key in PERCENTILES
              if row.get("mean_abs_error_to_knee", {}).get(key) is not None]
    goodput = [abs(row["goodput_error"]) for row in rows if row.get("goodput_error") is not None]
    optimistic = 0
    for row in rows:   # a simulated goodput past the grid is at least the grid's top: optimistic if that is
        g = row.get("goodput_rps") or {}
        if g.get("measured_bracketed") and g.get("simulated") is not None and g.get("measured"):
            optimistic += g["simulated"] / g["measured"] - 1 > OPTIMISTIC
    return {"rows": len(rows), "percentile_error": float(np.mean(errors)) if errors else None,
            "percentiles": len(errors), "goodput_error": float(np.mean(goodput)) if goodput else None,
            "goodput_rows": len(goodput), "optimistic_rows": optimistic}


def resimulate(kept: Kept, flags: list[str], out_dir: Path) -> list[dict]:
    """Resimulates one kept validation with `flags`; its summary rows."""
    command = [sys.executable, str(REPO / "bench" / "validate_planner.py"), "--resimulate",
               str(RESULTS / kept.directory), "--profile", str(RESULTS / kept.profile), "--transport", kept.transport,
               *flags, "--out-dir", str(out_dir)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"resimulating {kept.name} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads((out_dir / "summary.json").read_text())


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def table(scores: dict[str, dict[str, dict]], variants: list[str]) -> str:
    """Markdown: a row per validation (and one over all), each variant's percentile and goodput
    errors and its optimistic rows."""
    head = "| validation | rows | " + " | ".join(f"{v}: percentiles | {v}: goodput | {v}: optimistic"
                                                 for v in variants) + " |"
    lines = [head, "|" + "---|" * (2 + 3 * len(variants))]
    for name in scores[variants[0]]:
        cells = [f"{fmt(scores[v][name]['percentile_error'])} | {fmt(scores[v][name]['goodput_error'])} | "
                 f"{scores[v][name]['optimistic_rows']}" for v in variants]
        lines.append(f"| {name} | {scores[variants[0]][name]['rows']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overall(per_validation: dict[str, dict]) -> dict:
    """Every validation's rows pooled: percentile and goodput errors weighted by their counts."""
    rows = list(per_validation.values())
    def pooled(key: str, count: str) -> float | None:
        weighted = [(r[key], r[count]) for r in rows if r[key] is not None and r[count]]
        total = sum(c for _, c in weighted)
        return sum(v * c for v, c in weighted) / total if total else None
    return {"rows": sum(r["rows"] for r in rows), "percentile_error": pooled("percentile_error", "percentiles"),
            "percentiles": sum(r["percentiles"] for r in rows), "goodput_error": pooled("goodput_error", "goodput_rows"),
            "goodput_rows": sum(r["goodput_rows"] for r in rows),
            "optimistic_rows": sum(r["optimistic_rows"] for r in rows)}


def plot(scores: dict[str, dict[str, dict]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(scores)
    names = list(scores[variants[0]])
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.35 * len(names) + 2), sharey=True)
    y = np.arange(len(names))
    height = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        for ax, key in zip(axes, ("percentile_error", "goodput_error")):
            values = [100 * (scores[variant][n][key] or 0) for n in names]
            ax.barh(y + i * height, values, height=height, label=variant)
    for ax, title in zip(axes, ("mean |error|, latency percentiles to the knee (%)", "mean |goodput error| (%)")):
        ax.set_title(title, fontsize=9)
        ax.axvline(10, color="k", lw=0.6, ls="--")
    axes[0].set_yticks(y + 0.4 - height / 2, names, fontsize=7)
    axes[0].invert_yaxis()
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants = variants_of(args.variant)
    chosen = [k for k in KEPT if not args.only or k.name in args.only]
    if unknown := set(args.only) - {k.name for k in KEPT}:
        raise SystemExit(f"--only {sorted(unknown)}: not kept validations ({[k.name for k in KEPT]})")
    scores: dict[str, dict[str, dict]] = {}
    for variant, flags in variants.items():
        scores[variant] = {}
        for kept in chosen:
            print(f"{variant}: {kept.name} ...", flush=True)
            scores[variant][kept.name] = score(resimulate(kept, flags, args.out / "runs" / variant / kept.name))
        scores[variant]["all"] = overall(scores[variant])
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(scores, list(variants))
    print(text)
    (args.out / "resimulated_kept.md").write_text(text + "\n")
    (args.out / "resimulated_kept.json").write_text(json.dumps(
        {"variants": {name: flags for name, flags in variants.items()}, "scores": scores}, indent=1))
    plot(scores, args.out / "resimulated_kept.png")
    print(f"wrote {args.out / 'resimulated_kept.md'}, .json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
