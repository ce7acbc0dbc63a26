"""Do engines on different cores slow each other? A prompt computed on one core alone and while
another engine decodes on the other core, and that decode alone and beside prompts:

    python bench/corun.py --rounds 3 --out bench/results/corun

The measurement is `pdserve profile --through cluster`'s co-run pass (`planner.profiler.corun_probe`,
which says how): two colocated engines of `--model`, one per core (`--prefill-core`,
`--decode-core`), each in a process of its own bound to its core, alone and together alternating
within each round (alone, together, alone again; a round the host's speed moved in does not count). The
profile keeps the medians of together / alone as
`serving.corun_prefill_stretch` and `corun_decode_stretch`, which the simulator charges a step that
starts while another instance steps; this command prints every round, to see the spread. Writes
corun.json and corun.md. About 5 minutes on a 2-vCPU Xeon, 1,000-token prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def summary_table(rounds, prompt_tokens: int, batch: int, prefill_core: str, decode_core: str) -> str:
    """The rounds (`CorunRound`s) as a markdown table, one row per side: each round's time alone
    before and after, together, and together over the alones' mean; a round the host's drift
    voided (`steady_round`) is marked *."""
    from planner.profiler.corun_fit import steady_round

    lines = ["| what | where | alone before / after (s) | together (s) | together / alone |", "|---|---|---|---|---|"]
    mark = ["" if steady_round(r) else "*" for r in rounds]
    for name, where, key, ratio in (("prompt", f"{prompt_tokens} tokens on core {prefill_core}", "prompt", "prompt_ratio"),
                                    ("decode step", f"batch {batch} on core {decode_core}", "step", "step_ratio")):
        lines.append(f"| {name} | {where} | "
                     + " ; ".join(f"{getattr(r, key + '_alone_s'):.4f} / {getattr(r, key + '_alone_after_s'):.4f}"
                                  for r in rounds) + " | "
                     + " / ".join(f"{getattr(r, key + '_together_s'):.4f}" for r in rounds) + " | "
                     + " / ".join(f"{getattr(r, ratio):.3f}{m}" for r, m in zip(rounds, mark)) + " |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill-core", default="0", help="the core computing the prompts (default 0)")
    parser.add_argument("--decode-core", default="1", help="the core decoding (default 1)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="steady rounds of alone / together / alone wanted (default 3); a round the host's speed "
                             "moved in does not count, and up to twice as many run")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="the prompt's length (default 1024)")
    parser.add_argument("--batch", type=int, default=16, help="requests decoding together (default 16)")
    parser.add_argument("--model", default="models/bench", help="model directory (default models/bench)")
    parser.add_argument("--kv-cache-mb", type=int, default=512, help="each engine's KV cache (default 512)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/corun"), help="output directory")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from dataclasses import replace

    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings
    from planner.profiler.corun_fit import corun_plan, corun_stretches, steady_round
    from planner.profiler.corun_probe import measure_corun
    from planner.profiler.host import model_info

    args.out.mkdir(parents=True, exist_ok=True)
    dtype = resolve_auto_dtype(args.model, args.prefill_core).dtype
    max_model_len = min(4096, json.loads((Path(args.model) / "config.json").read_text())["max_position_embeddings"])
    settings = EngineSettings(model=args.model, dtype=dtype, max_model_len=max_model_len, kv_cache_bytes=args.kv_cache_mb << 20,
                              max_num_seqs=64, enable_prefix_caching=False)
    kv_tokens = settings.kv_cache_bytes // model_info(args.model, dtype, settings.block_size).kv_bytes_per_token
    plan = replace(corun_plan(settings.max_model_len, settings.max_num_seqs, kv_tokens, quick=False),
                   prompt_tokens=args.prompt_tokens, batch=args.batch, rounds=args.rounds, max_rounds=2 * args.rounds)
    measured = measure_corun(settings, (args.prefill_core, args.decode_core), plan,
                             lambda label: print(label, flush=True))
    prompt, step = corun_stretches(measured)
    rounds = [asdict(r) for r in measured]
    table = summary_table(measured, plan.prompt_tokens, plan.batch, args.prefill_core, args.decode_core)
    steady = sum(map(steady_round, measured))
    summary = (f"{table}\n\nmedians over {steady} steady rounds of {len(measured)}: prompt {prompt:.3f}x, "
               f"decode step {step:.3f}x (dtype {dtype})\n")
    (args.out / "corun.json").write_text(json.dumps({"plan": asdict(plan), "dtype": dtype, "rounds": rounds}, indent=1))
    (args.out / "corun.md").write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
