"""Do engines on different cores slow each other? A decode step at several batches beside another
engine computing prompts, and a prompt beside a batch decoding, against each alone:

    python bench/corun.py --model models/tiny --repeat 3 --out bench/results/corun

The measurement is `pdserve profile --through cluster`'s co-run pass (`planner.profiler.corun_probe`,
which says how): two colocated engines of `--model`, one per core (`--prefill-core`,
`--decode-core`), each in a process of its own bound to its core and tracing its steps. In each
phase one engine works throughout while the other alternates windows of work and idle; every cycle
sets its steps beside the other engine against its steps alone, and the phase's stretch is the
median over the cycles (`planner.profiler.corun_fit`). The profile keeps the prompt's as
`serving.corun_prefill_stretch` and the median over the decode batches as `corun_decode_stretch`,
which the simulator charges a step that starts while another instance steps. This command prints
every phase's cycles, to see the spread, and with `--repeat N` runs the whole probe N times (the
engines started again each time) to see how far one profile's figure moves from the next. Writes
corun.json, corun.md and corun.png (each cycle's ratio, by phase and repeat). About a minute a
repeat on the tiny model; several on `models/bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def summary_table(repeats) -> str:
    """The phases of each repeat (lists of `CorunMeasure`) as a markdown table, one row per phase
    and repeat: its cycles' ratios, their median and 10th-90th percentile, and the steps counted;
    then the profile's two figures per repeat."""
    from planner.profiler.corun_fit import corun_stretches

    lines = ["| repeat | phase | cycles' beside / alone | median | p10-p90 | steps beside / alone |",
             "|---|---|---|---|---|---|"]
    for n, measures in enumerate(repeats, 1):
        for m in measures:
            what = f"decode step, batch {m.batch}" if m.what == "decode" else f"prompt, beside a batch of {m.batch}"
            low, high = m.spread
            lines.append(f"| {n} | {what} | {' '.join(f'{r:.3f}' for r in m.cycle_ratios)} | {m.ratio:.3f} | "
                         f"{low:.3f}-{high:.3f} | {m.beside_steps} / {m.alone_steps} |")
    lines.append("")
    for n, measures in enumerate(repeats, 1):
        prompt, step = corun_stretches(measures)
        lines.append(f"repeat {n}: the profile would keep a prompt {_x(prompt)}, a decode step {_x(step)}")
    return "\n".join(lines) + "\n"


def _x(ratio: float | None) -> str:
    return "not measured" if ratio is None else f"{ratio:.3f}x"


def plot(repeats, path: Path) -> None:
    """Each phase's cycle ratios (dots) and median (bar), repeats side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = sorted({(m.what, m.batch) for measures in repeats for m in measures}, key=lambda p: (p[0] != "decode", p[1]))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(repeats))
    for n, measures in enumerate(repeats):
        by_phase = {(m.what, m.batch): m for m in measures}
        for i, phase in enumerate(phases):
            if phase not in by_phase:
                continue
            x = i - 0.4 + width * (n + 0.5)
            m = by_phase[phase]
            ax.scatter([x] * len(m.cycle_ratios), m.cycle_ratios, s=10, color=f"C{n}", alpha=0.6)
            ax.hlines(m.ratio, x - width / 2, x + width / 2, color=f"C{n}", label=f"repeat {n + 1}" if i == 0 else None)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(phases)))
    ax.set_xticklabels([f"decode step\nbatch {b}" if w == "decode" else f"prompt\nbeside {b}" for w, b in phases])
    ax.set_ylabel("beside the other engine / alone")
    ax.set_title("co-run stretch: each cycle (dots), its phase's median (bar)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill-core", default="0", help="the core computing the prompts (default 0)")
    parser.add_argument("--decode-core", default="1", help="the core decoding (default 1)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="how many times to run the whole probe, engines started again each time (default 1)")
    parser.add_argument("--cycles", type=int, default=12,
                        help="windows of work and idle a phase, at least (default 12; as many as fill 15 s)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="the prompt's length (default 1024)")
    parser.add_argument("--batches", default="1,4,16",
                        help="the decode batches measured beside prompts, comma-separated (default 1,4,16)")
    parser.add_argument("--model", default="models/bench", help="model directory (default models/bench)")
    parser.add_argument("--kv-cache-mb", type=int, default=512, help="each engine's KV cache (default 512)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/corun"), help="output directory")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from dataclasses import replace

    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings
    from planner.profiler.corun_fit import corun_plan
    from planner.profiler.corun_probe import measure_corun
    from planner.profiler.host import model_info

    args.out.mkdir(parents=True, exist_ok=True)
    dtype = resolve_auto_dtype(args.model, args.prefill_core).dtype
    max_model_len = min(4096, json.loads((Path(args.model) / "config.json").read_text())["max_position_embeddings"])
    settings = EngineSettings(model=args.model, dtype=dtype, max_model_len=max_model_len, kv_cache_bytes=args.kv_cache_mb << 20,
                              max_num_seqs=64, enable_prefix_caching=False)
    kv_tokens = settings.kv_cache_bytes // model_info(args.model, dtype, settings.block_size).kv_bytes_per_token
    plan = replace(corun_plan(settings.max_model_len, settings.max_num_seqs, kv_tokens, quick=False),
                   prompt_tokens=args.prompt_tokens, cycles=args.cycles,
                   decode_batches=tuple(int(b) for b in args.batches.split(",")))
    repeats = []
    for n in range(args.repeat):
        print(f"repeat {n + 1} of {args.repeat}", flush=True)
        repeats.append(measure_corun(settings, (args.prefill_core, args.decode_core), plan,
                                     lambda label: print(label, flush=True)))
    summary = summary_table(repeats) + f"\n(dtype {dtype}, {args.model}, cores {args.prefill_core} and {args.decode_core})\n"
    (args.out / "corun.json").write_text(json.dumps({"plan": asdict(plan), "dtype": dtype,
                                                      "repeats": [[asdict(m) for m in ms] for ms in repeats]}, indent=1))
    (args.out / "corun.md").write_text(summary)
    plot(repeats, args.out / "corun.png")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
