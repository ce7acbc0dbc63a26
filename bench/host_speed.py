"""Is this machine steady enough to compare figures on? Times one fixed matrix product on each core,
window after window, each core alone and then all together, and says how far the speed moved.

Run it before a benchmark session (about a minute, nothing else running), timing the product in
the arithmetic the engines will compute in (`pdserve up --dtype auto` picks it per host kind: the
profile's `dtype_choice` says which):

    python bench/host_speed.py --out bench/results/host_speed_amx --product bfloat16

The quiet check of the benchmarks sees other processes inside this VM, not the host under it: a
neighbour on the same physical core, or a clock that moves, slows every system that runs then.
Here a 2-vCPU VM whose p10-p90 swing is 1.05x compares systems to 5%; one at 2x cannot tell a 30%
difference between two runs from the machine (compare only what ran side by side, and repeat).
The together/alone ratio says whether the two virtual cores slow each other (one physical core
underneath): then a one-core engine table, measured with the other core idle, is optimistic for
a 1P+1D cluster that keeps both busy. See loadgen/comparison/host_speed.py for what is computed.

Writes OUT/host_speed.json (every window), OUT/host_speed.md and OUT/host_speed.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadgen.comparison.host_speed import MAX_SWING, phase_speed, verdict  # noqa: E402
from loadgen.host_probe import CHECKS, describe_product, run_phase  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for host_speed.{json,md,png}")
    parser.add_argument("--cores", default=None,
                        help="comma-separated cores to probe (default: every core this process may use)")
    parser.add_argument("--product", choices=CHECKS, default="float32",
                        help="the product timed: float32 (numpy's BLAS, the default) or a prompt-shaped bfloat16 or "
                             "float16 GEMM through torch (what bfloat16 engines compute: on an AMX Xeon it slowed 1.3x "
                             "while float32 held), or python, a pure-Python loop (what a small model's decode steps and "
                             "the serving hops run at: on a Zen 4 EPYC VM it swung 1.6x while bfloat16 held)")
    parser.add_argument("--phase-s", type=float, default=20.0,
                        help="seconds of each phase: each core alone, then all together (default 20)")
    parser.add_argument("--window-s", type=float, default=1.0,
                        help="seconds of one timed window; the swing is over windows (default 1)")
    parser.add_argument("--max-swing", type=float, default=MAX_SWING,
                        help=f"p90/p10 (and together/alone) above which the machine is called not steady "
                             f"(default {MAX_SWING})")
    args = parser.parse_args(argv)
    if args.phase_s <= 0 or args.window_s <= 0 or args.window_s > args.phase_s:
        parser.error("need 0 < --window-s <= --phase-s")
    if args.max_swing <= 1:
        parser.error("--max-swing must be above 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cores = ([int(c) for c in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0)))
    windows: dict[str, dict[int, list[float]]] = {}
    phases_in_order = [(f"core {core} alone", [core]) for core in cores] + [("all together", cores)]
    for index, (name, on) in enumerate(phases_in_order, 1):
        print(f"[{index}/{len(phases_in_order)}] {name}: {args.phase_s:g} s ...", flush=True)
        windows[name] = run_phase(on, args.phase_s, args.window_s, args.product)
    alone = [phase_speed(f"core {core} alone", windows[f"core {core} alone"][core]) for core in cores]
    together = [phase_speed(f"core {core} with the others busy", windows["all together"][core]) for core in cores]
    judged = verdict(alone, together, args.max_swing)

    args.out.mkdir(parents=True, exist_ok=True)
    rows = [*alone, *together]
    table = ["| phase | windows | p10 ms | p50 ms | p90 ms | slowest ms | swing (p90/p10) |", "|---|---|---|---|---|---|---|"]
    table += [f"| {p.name} | {p.windows} | {p.p10_ms:.2f} | {p.p50_ms:.2f} | {p.p90_ms:.2f} | {p.max_ms:.2f} | "
              f"{p.swing:.2f} |" for p in rows]
    timed = describe_product(args.product) if args.product == "python" else f"one {describe_product(args.product)} product"
    summary = f"{judged.text}\n\n({timed}, {args.window_s:g} s windows)"
    (args.out / "host_speed.md").write_text("\n".join(table) + "\n\n" + summary + "\n")
    (args.out / "host_speed.json").write_text(json.dumps({
        "cores": cores, "phase_s": args.phase_s, "window_s": args.window_s, "product": describe_product(args.product),
        "windows_ms": {name: {str(c): w for c, w in per_core.items()} for name, per_core in windows.items()},
        "steady": judged.steady, "worst_swing": judged.worst_swing, "together_over_alone": judged.sharing,
        "verdict": judged.text}, indent=1))
    plot(windows, args.window_s, args.out / "host_speed.png")
    print("\n".join(table))
    print(summary)
    print(f"wrote {args.out}/host_speed.{{json,md,png}}")
    return 0


def plot(windows: dict[str, dict[int, list[float]]], window_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    offset = 0.0
    for name, per_core in windows.items():
        length = max(len(w) for w in per_core.values())
        for core, series in per_core.items():
            ax.plot([offset + (i + 0.5) * window_s for i in range(len(series))], series, marker=".",
                    label=f"{name}: core {core}" if "together" in name else name)
        ax.axvline(offset, color="grey", lw=0.5)
        offset += length * window_s
    ax.set_xlabel("time (s)")
    ax.set_ylabel("ms per product (lower is faster)")
    ax.set_title("one fixed matrix product per core, window by window")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
