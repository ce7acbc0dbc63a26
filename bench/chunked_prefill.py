"""What computing a prompt in chunks costs against one pass, on one engine alone on one core:

    python bench/chunked_prefill.py --out bench/results/chunked_prefill --profile planner/profiles/<profile>.json

vLLM computes a prompt longer than its step's token budget (`max_num_batched_tokens`) in chunks,
each attending to the chunks before it through the KV cache. The planner searches budgets of 256,
512 and 1024 tokens (the hybrid's and the colocated engines' `@n`), and before `pdserve profile`
measured prompts in small chunks its model charged a chunked prompt only one step's overhead per
chunk more than one pass (the attention term telescopes to n^2). Per round, per budget (in an order
that rotates with the round): one engine of that budget on core 0 (`pdserve.engine.start_engine`,
the profile's settings), each prompt length `--repeats` times (median). Reports each length's time
per budget and its ratio to the largest budget's (one pass for every length measured), and with
`--profile`, what that profile's model predicts for the same (`PerfModel.prefill_s(n, budget)`).
Writes chunked_prefill.json, .md and .png. About 4 minutes on the bench model on a slow 2-vCPU EPYC.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BUDGETS = (2048, 256, 1024, 512)
PROMPTS = (256, 512, 1024, 2000)


def budget_order(budgets: tuple[int, ...], round_index: int) -> list[int]:
    """The budgets in round `round_index`'s order: rotated by the round, so none always goes first."""
    shift = round_index % len(budgets)
    return list(budgets[shift:] + budgets[:shift])


def summarize(rows: list[dict], one_pass_budget: int, predicted=None) -> list[dict]:
    """Per (budget, prompt): the median over rounds, its ratio to the same prompt at
    `one_pass_budget`, and (`predicted(prompt, budget)` given) the model's time and ratio."""
    cells: dict[tuple[int, int], list[float]] = {}
    for row in rows:
        cells.setdefault((row["budget"], row["prompt_tokens"]), []).append(row["seconds"])
    medians = {key: statistics.median(values) for key, values in cells.items()}
    out = []
    for (budget, prompt), seconds in sorted(medians.items()):
        one_pass = medians.get((one_pass_budget, prompt))
        entry = {"budget": budget, "prompt_tokens": prompt, "rounds": len(cells[(budget, prompt)]),
                 "seconds": seconds, "ratio": seconds / one_pass if one_pass else None}
        if predicted is not None:
            model_s = predicted(prompt, budget)
            entry |= {"model_s": model_s, "model_ratio": model_s / predicted(prompt, one_pass_budget)}
        out.append(entry)
    return out


async def _measure_budget(model: str, budget: int, prompts: tuple[int, ...], repeats: int, args) -> dict[int, float]:
    from pdserve.engine import EngineSettings, start_engine
    from planner.profiler.engine_probe import EngineProbe

    settings = EngineSettings(model=model, max_model_len=args.max_model_len, kv_cache_bytes=args.kv_cache_mb << 20,
                              max_num_batched_tokens=budget, enable_prefix_caching=False, cpu_cores=args.core)
    engine = start_engine(settings, "colocated")
    try:
        probe = EngineProbe(engine, int(engine.vllm_config.model_config.get_vocab_size()), seed=budget)
        await probe.warm_up()
        return {n: await probe.prefill_s(n, repeats) for n in prompts}
    finally:
        engine.shutdown()
        del engine
        gc.collect()


def _shown(path: str) -> str:
    """`path` relative to the checkout where it lies inside it (results name no machine's folders)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else path


def _markdown(summary: list[dict], has_model: bool) -> str:
    head = ["budget", "prompt", "seconds (median)", "/ one pass"] + (["model", "model / one pass"] if has_model else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        cells = [str(s["budget"]), str(s["prompt_tokens"]), f"{s['seconds']:.3f}",
                 f"{s['ratio']:.3f}" if s["ratio"] else "-"]
        if has_model:
            cells += [f"{s['model_s']:.3f}", f"{s['model_ratio']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(summary: list[dict], path: Path, has_model: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for budget in sorted({s["budget"] for s in summary}):
        rows = [s for s in summary if s["budget"] == budget]
        line = ax.plot([s["prompt_tokens"] for s in rows], [s["ratio"] for s in rows], "o-", label=f"measured, {budget}")
        if has_model:
            ax.plot([s["prompt_tokens"] for s in rows], [s["model_ratio"] for s in rows], "--",
                    color=line[0].get_color(), label=f"model, {budget}")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set(xlabel="prompt tokens", ylabel="time / one pass", title="a prompt in chunks of the budget, one engine, one core")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "models" / "bench"), help="model folder (default models/bench)")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)),
                        help="token budgets, comma-separated; the largest must hold every prompt in one pass")
    parser.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="prompt lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every budget (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="each prompt's repeats per engine (median; default 3)")
    parser.add_argument("--core", default="0", help="the engine's core (default 0)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--profile", type=Path, help="a profile whose fitted model is printed beside the measurement")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args()
    budgets = tuple(int(b) for b in args.budgets.split(","))
    prompts = tuple(int(n) for n in args.prompts.split(","))
    if max(prompts) > max(budgets):
        parser.error(f"the largest budget ({max(budgets)}) must hold the longest prompt ({max(prompts)}) in one pass")
    predicted = None
    if args.profile:
        from planner.perf_model import fit_perf_model
        from planner.profile import load_profile

        predicted = fit_perf_model(load_profile(args.profile)).model.prefill_s
    rows = []
    for round_index in range(args.rounds):
        for budget in budget_order(budgets, round_index):
            started = time.perf_counter()
            times = asyncio.run(_measure_budget(args.model, budget, prompts, args.repeats, args))
            rows += [{"round": round_index, "budget": budget, "prompt_tokens": n, "seconds": s} for n, s in times.items()]
            print(f"round {round_index} budget {budget}: " + ", ".join(f"{n} {s * 1e3:.0f} ms" for n, s in times.items())
                  + f" ({time.perf_counter() - started:.0f} s)", flush=True)
    summary = summarize(rows, max(budgets), predicted)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chunked_prefill.json").write_text(json.dumps(
        {"command": " ".join(sys.argv), "model": _shown(args.model), "profile": str(args.profile) if args.profile else None,
         "rows": rows, "summary": summary}, indent=1))
    (args.out / "chunked_prefill.md").write_text(_markdown(summary, predicted is not None))
    _plot(summary, args.out / "chunked_prefill.png", predicted is not None)
    print(_markdown(summary, predicted is not None))
    print(f"wrote {args.out}/chunked_prefill.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
