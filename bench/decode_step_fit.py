"""What a served decode step adds to the engine's, fitted on the steps a loaded cluster traced.

The profile's served step (`ServingCosts`: a + b x batch over the engine-only model) is fitted on
idle batched runs. This reads the decode engines' step traces of real runs (`bench/validate_planner.py
--step-trace`, or any run with PDSERVE_VLLM_STEP_TRACE_DIR set: `pdserve.engine_step_trace`) and
fits the extra each traced step took over the profile's model of it, a + b x batch (+ c x context),
on every decode step no request joined (`planner.validation_steps.fit_step_extra`); then prints,
per trace file, its mean step, the fit's mean miss, and what the profile's own line misses
(both signed: positive, the step took longer than charged); and, where the prefill engine's trace
is beside it, the decode steps it ran beside against those it left alone, by batch
(`planner.validation_steps.corun_by_batch`), set against the profile's co-run stretch.

    python bench/decode_step_fit.py --profile planner/profiles/tiny_2cpu_amx167_served.json \\
        --traces bench/results/x/1P+1D --out out/decode_step_fit

Writes OUT/decode_step_fit.{json,png}: the fits, the per-file rows, and the extra by batch of each
file beside the fitted and the profile's lines. Nothing is run: it reads traces.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pdserve.engine_step_trace import read_steps
from planner.perf_model import fit_perf_model
from planner.profile import load_profile
from planner.validation_steps import BATCH_BUCKETS, bucket_label, corun_by_batch, fit_step_extra, steady_decode_steps

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, required=True, help="the profile whose engine model the extra is over")
    p.add_argument("--traces", type=Path, action="append", required=True,
                   help="a directory searched for decode engines' trace files (steps-decode-*.csv); repeat for several")
    p.add_argument("--out", type=Path, default=REPO / "out" / "decode_step_fit", help="output directory")
    return p.parse_args(argv)


def file_row(name: str, steps, model_step_s, fitted, profile_line) -> dict:
    """One trace file: its decode steps without a join, their mean measured step, and the mean
    signed miss of the fit and of the profile's line (measured - charged, ms), and the extra by batch."""
    chosen = steady_decode_steps(steps)
    measured = np.array([s.duration_s for s in chosen])
    model = np.array([model_step_s(s.batch, s.context_tokens) for s in chosen])
    fit_miss = measured - model - np.array([fitted.extra_s(s.batch, s.context_tokens) for s in chosen])
    line_miss = measured - model - np.array([profile_line(s.batch) for s in chosen])
    by_batch = []
    for low, high in BATCH_BUCKETS:
        mask = np.array([low <= s.batch <= high for s in chosen])
        if mask.any():
            by_batch.append({"batch": bucket_label(low, high), "steps": int(mask.sum()),
                             "mean_batch": round(float(np.mean([s.batch for s, m in zip(chosen, mask) if m])), 2),
                             "extra_ms": round(float((measured - model)[mask].mean()) * 1e3, 4)})
    return {"file": name, "steps": len(chosen), "mean_step_ms": round(float(measured.mean()) * 1e3, 4),
            "fit_miss_ms": round(float(fit_miss.mean()) * 1e3, 4),
            "fit_abs_miss": round(float(np.abs(fit_miss).mean() / measured.mean()), 4),
            "profile_line_miss_ms": round(float(line_miss.mean()) * 1e3, 4), "by_batch": by_batch}


def plot(rows: list[dict], fitted, profile_line, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for row in rows:
        ax.plot([b["mean_batch"] for b in row["by_batch"]], [b["extra_ms"] for b in row["by_batch"]], "o-",
                label=row["file"], alpha=0.7)
    batches = np.arange(1, 65)
    ax.plot(batches, [fitted.extra_s(b, 0) * 1e3 for b in batches], "k--", label="fitted (no context)")
    ax.plot(batches, [profile_line(b) * 1e3 for b in batches], "k:", label="the profile's served line")
    ax.set_xlabel("decode batch")
    ax.set_ylabel("traced step - the profile's engine step (ms)")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=6)
    ax.set_title("what a served decode step adds to the engine's, by batch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.profile)
    model = fit_perf_model(profile).model
    profile_line = lambda batch: profile.serving.decode_serving_s(batch, by_batch=False)  # noqa: E731
    traces, folders = {}, {}
    for root in args.traces:
        for path in sorted(root.rglob("steps-decode-*.csv")):
            steps = read_steps(path)
            if steady_decode_steps(steps):
                name = str(path.relative_to(root.parent))
                traces[name], folders[name] = steps, path.parent
    if not traces:
        raise SystemExit(f"no decode step traces (steps-decode-*.csv) under {[str(t) for t in args.traces]}")
    every = [s for steps in traces.values() for s in steps]
    fits = {"with_context": fit_step_extra(every, model.decode_step_s),
            "batch_only": fit_step_extra(every, model.decode_step_s, with_context=False)}
    for name, fit in fits.items():
        print(f"{name}: extra = {fit.per_step_s * 1e3:.3f} ms + {fit.per_seq_s * 1e3:.4f} ms x batch + "
              f"{fit.per_context_token_s * 1e9:.2f} ns x context over {fit.steps} steps (mean |miss| "
              f"{fit.mean_abs_error:.1%} of the mean step)")
    print(f"the profile's served line: {profile.serving.decode_step_s * 1e3:.3f} ms + "
          f"{profile.serving.decode_cpu_s_per_token * 1e3:.4f} ms x batch")
    rows = [file_row(name, steps, model.decode_step_s, fits["with_context"], profile_line) for name, steps in traces.items()]
    for row in rows:
        print(f"{row['file']}: {row['steps']} steps, mean {row['mean_step_ms']:.2f} ms; measured - charged: "
              f"{row['fit_miss_ms']:+.3f} ms by the fit (mean |miss| {row['fit_abs_miss']:.1%}), "
              f"{row['profile_line_miss_ms']:+.3f} ms by the profile's line")
    print(f"decode steps beside the prefill engine's / alone (median ms, by batch; the profile's co-run stretch "
          f"{profile.serving.corun_decode_stretch:.3f}):")
    for row in rows:
        prefill = [s for path in sorted(folders[row["file"]].glob("steps-prefill-*.csv")) for s in read_steps(path)]
        row["corun"] = [vars(c) | {"ratio": round(c.ratio, 4)} for c in corun_by_batch(traces[row["file"]], prefill)]
        if row["corun"]:
            print(f"  {row['file']}: " + "; ".join(f"b{c['batch']} {c['beside_s'] * 1e3:.2f} / {c['alone_s'] * 1e3:.2f} "
                                                   f"= x{c['ratio']:.2f}" for c in row["corun"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_step_fit.json").write_text(json.dumps(
        {"profile": str(args.profile), "traces": [str(t) for t in args.traces],
         "fits": {name: vars(fit) for name, fit in fits.items()}, "files": rows}, indent=1))
    plot(rows, fits["batch_only"], profile_line, args.out / "decode_step_fit.png")
    print(f"wrote {args.out / 'decode_step_fit.json'} and {args.out / 'decode_step_fit.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
