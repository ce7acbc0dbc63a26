"""pdserve's engine defaults against vLLM's, and what each choice contributes. Run `--help`."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from loadgen.proc_cpu import OtherLoad, wait_for_quiet
from pdserve.dtype_probe import resolve_auto_dtype, this_host_kind
from pdserve.make_model import build_model
from pdserve.engine import DEFAULT_VLLM_SPIN_MS
from pdserve.preload import DEFAULT_LIBRARIES, find_preload
from planner.profiler.engine_speed import VLLM_AUTO, Variant, median_result, run_variant, speed_table

DESCRIPTION = """\
Measures one vLLM engine of the `bench` model bound to one core (what one worker gets on a 2-core
host), each variant in a fresh process, through the path a worker's requests take: prefill of a
1,024-token prompt alone, and decode steps at batch 1, 8 and 32 (128-token prompts). Variants, each
adding one of pdserve's choices to the one before:

  vLLM defaults      --dtype auto as vLLM resolves it, no preload, vLLM's busy-polling
  + measured dtype   the dtype pdserve's probe picks on this host (--dtype auto in pdserve)
  + tcmalloc         LD_PRELOAD libtcmalloc_minimal (vLLM's CPU guide)
  pdserve defaults   + pdserve's cap on vLLM's busy-polling (DEFAULT_VLLM_SPIN_MS): what a pdserve worker runs
  + Intel OpenMP     pdserve defaults with libiomp5 preloaded too (vLLM's CPU guide; opt-in:
                     --preload tcmalloc,iomp5)
  other dtype        pdserve defaults with the dtype the probe did not pick

Variants run in order, then in reverse (ABBA), --rounds times; the report takes each time's
median and the speed-up against vLLM's defaults (> 1: faster). --variants picks a subset (vLLM
defaults always runs: it is the baseline). Results go to --out as JSON, Markdown and a PNG.

Noise guard (as in the goodput benchmark): before each run the benchmark waits up to
--quiet-wait-s for other processes (and the hypervisor's steal) to use at most --quiet-cores; a run
during which they used more is "noisy" and measured once more (--noisy-retries), the quieter
attempt kept. Each run's noise is in the JSON (`other_load_cores`).
"""


def variants(measured: str) -> list[Variant]:
    other = "float32" if measured == "bfloat16" else "bfloat16"
    return [Variant("vLLM defaults", VLLM_AUTO), Variant("+ measured dtype", measured),
            Variant("+ tcmalloc", measured, ("tcmalloc",)),
            Variant("pdserve defaults", measured, DEFAULT_LIBRARIES, DEFAULT_VLLM_SPIN_MS),
            Variant("+ Intel OpenMP", measured, ("tcmalloc", "iomp5"), DEFAULT_VLLM_SPIN_MS),
            Variant(f"other dtype ({other})", other, DEFAULT_LIBRARIES, DEFAULT_VLLM_SPIN_MS)]


def select_variants(all_variants: list[Variant], names: str) -> list[Variant]:
    """The variants named in `names` (comma-separated; empty: all), in their usual order, with the
    baseline ("vLLM defaults") always kept; raises ValueError on an unknown name."""
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    unknown = wanted - {v.name for v in all_variants}
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; known: {[v.name for v in all_variants]}")
    if not wanted:
        return all_variants
    return [v for v in all_variants if v.name in wanted or v.name == "vLLM defaults"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/bench", help="checkpoint (built with make-model if missing)")
    parser.add_argument("--cores", default="1", help="the cores the engine is bound to (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds (each runs every variant twice)")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--decode-steps", type=int, default=128,
                        help="tokens each sequence decodes per decode measurement (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measurements of each time per run; the run reports their median (default: %(default)s)")
    parser.add_argument("--variants", default="",
                        help="comma-separated variant names to run (default: all); e.g. "
                             "'pdserve defaults,+ Intel OpenMP'")
    parser.add_argument("--quiet-cores", type=float, default=0.25,
                        help="other processes' CPU above which a run counts as noisy (default: %(default)s)")
    parser.add_argument("--quiet-wait-s", type=float, default=60.0,
                        help="longest wait for a quiet machine before each run (default: %(default)s)")
    parser.add_argument("--noisy-retries", type=int, default=1,
                        help="re-measurements of a noisy run, the quietest kept (default: %(default)s)")
    parser.add_argument("--out", default="bench/results/fast_defaults", help="output folder")
    args = parser.parse_args(argv)

    model = Path(args.model)
    if not (model / "config.json").exists():
        build_model(model.name if model.name in ("tiny", "bench") else "bench", model)
    out = Path(args.out)
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    decision = resolve_auto_dtype(str(model), args.cores)
    found = find_preload()
    print(f"host kind {this_host_kind()}\n{decision.summary()}\n{found.summary()}", flush=True)
    chosen = select_variants(variants(decision.dtype), args.variants)
    order = [v for _ in range(args.rounds) for v in chosen + chosen[::-1]]
    runs: dict[str, list] = {v.name: [] for v in chosen}
    noise: dict[str, list[float]] = {v.name: [] for v in chosen}
    for index, variant in enumerate(order, 1):
        attempts = []
        while len(attempts) <= args.noisy_retries:
            wait_for_quiet(args.quiet_cores, args.quiet_wait_s)
            meter = OtherLoad.start()
            result = run_variant(variant, str(model), args.cores, runs_dir / f"run-{index}.json", found,
                                 args.prompt_tokens, (1, 8, 32), context_tokens=128, steps=args.decode_steps,
                                 repeats=args.repeats)
            attempts.append((meter.stop(), result))
            steps = ", ".join(f"b{b} {s * 1e3:.1f} ms" for b, s in result.decode_step_s.items())
            print(f"[{index}/{len(order)}] {variant.name}: {result.dtype}, prefill {result.prefill_s * 1e3:.0f} ms, "
                  f"decode {steps}; other load {attempts[-1][0]:.2f} cores", flush=True)
            if attempts[-1][0] <= args.quiet_cores:
                break
        other_cores, result = min(attempts, key=lambda attempt: attempt[0])
        runs[variant.name].append(result)
        noise[variant.name].append(round(other_cores, 3))
    medians = [median_result(runs[v.name]) for v in chosen]
    rows = speed_table(medians, baseline="vLLM defaults")
    report = {"host_kind": this_host_kind(), "machine": platform.machine(), "cores": args.cores,
              "dtype_decision": json.loads(decision.to_json()), "preload": found.summary(),
              "rounds": args.rounds, "quiet_cores": args.quiet_cores, "rows": rows,
              "runs": {k: [r.to_dict() | {"other_load_cores": noise[k][i]} for i, r in enumerate(v)]
                       for k, v in runs.items()}}
    (out / "fast_defaults.json").write_text(json.dumps(report, indent=2))
    markdown = _markdown(rows)
    (out / "fast_defaults.md").write_text(markdown)
    _plot(rows, out / "fast_defaults.png")
    print(markdown)
    return 0


def _markdown(rows: list[dict]) -> str:
    lines = ["| variant | dtype | prefill 1k ms (x) | decode b1 ms (x) | decode b8 ms (x) | decode b32 ms (x) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r['prefill_ms']:.0f} ({r['prefill_speedup']:.2f})"]
        cells += [f"{r[f'decode_b{b}_ms']:.1f} ({r[f'decode_b{b}_speedup']:.2f})" for b in (1, 8, 32)]
        lines.append(f"| {r['variant']} | {r['dtype']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("prefill_speedup", "prefill 1k"), ("decode_b1_speedup", "decode b1"),
               ("decode_b8_speedup", "decode b8"), ("decode_b32_speedup", "decode b32")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        ax.bar([m + i * width for m in range(len(metrics))], [row[key] for key, _ in metrics], width,
               label=f"{row['variant']} ({row['dtype']})")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([m + width * (len(rows) - 1) / 2 for m in range(len(metrics))], [label for _, label in metrics])
    ax.set_ylabel("speed-up vs vLLM defaults (higher is faster)")
    ax.set_title("One engine on one core: pdserve's defaults, one choice at a time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
