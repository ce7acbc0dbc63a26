"""Does the perf model's mixed step hold? A prompt computed beside running decodes (vLLM's chunked
prefill: the decodes take their tokens of the step's budget, the prompt's chunk the rest), its
time to first token measured on a real engine and predicted by the model a profile fits:

    python bench/mixed_step.py --profile planner/profiles/bench_2cpu_xeon_avx512_wide_served.json \\
        --out bench/results/mixed_step

The planner predicts a colocated engine (vLLM's own server, an aggregated or hybrid pdserve worker)
with `PerfModel.mixed_step_s`: one step overhead plus the prefill chunk's and the decodes' own
terms, never measured as such by the profiler. Per engine (`--cores` x `--budgets`, each in a fresh
process, the `bench` model and the dtype `pdserve up` runs): `--decodes` requests of 256-token
prompts decoding, then a prompt of `--prompts` tokens alone beside them (twice each); the decodes'
step just before it too. Predicted: the prompt's chunks one step at a time, each `mixed_step_s`
of its chunk beside the decodes (the model of one engine over that many cores, `PerfModel.on_devices`).
Writes mixed_step.json and mixed_step.md. About 8 minutes on a 2-vCPU Xeon.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DECODE_PROMPT_TOKENS, DECODE_MAX_TOKENS, REPEATS = 256, 120, 2
_ids = itertools.count()


def predicted_ttft_s(model, prompt_tokens: int, budget: int, decodes: int, context_tokens: int) -> float:
    """The prompt's time beside `decodes` running ones (summed context `context_tokens`, each step
    adding one token per decode), its chunks the budget the decodes leave; alone: `prefill_s`."""
    if decodes == 0:
        return model.prefill_s(prompt_tokens, budget)
    if decodes >= budget:
        raise ValueError(f"{decodes} decodes leave nothing of a {budget}-token budget for the prompt")
    total, done, steps = 0.0, 0, 0
    while done < prompt_tokens:
        chunk = min(budget - decodes, prompt_tokens - done)
        total += model.mixed_step_s(chunk, (done + chunk) ** 2 - done ** 2, decodes, context_tokens + steps * decodes,
                                    prior=chunk * done)
        done, steps = done + chunk, steps + 1
    return total


async def _stream(engine, prompt_ids: list[int], max_tokens: int, marks: list) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    produced = 0
    async for output in engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, f"mixed-{next(_ids)}"):
        produced += len(output.outputs[0].token_ids)
        marks.append((time.perf_counter(), produced))


def _step_before_s(marks: list, until: float, window_s: float = 0.5) -> float | None:
    inside = [(t, n) for t, n in marks if until - window_s <= t <= until]
    if len(inside) < 2 or inside[-1][1] == inside[0][1]:
        return None
    return (inside[-1][0] - inside[0][0]) / (inside[-1][1] - inside[0][1])


async def one_engine(cores: str, budget: int, decodes: list[int], prompts: list[int], model_dir: str) -> list[dict]:
    """Starts one engine on `cores` with `budget` tokens a step, measures every case, stops it."""
    import numpy as np

    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings, start_engine

    settings = EngineSettings(model=model_dir, dtype=resolve_auto_dtype(model_dir, cores).dtype, max_model_len=4096,
                              kv_cache_bytes=1024 << 20, max_num_seqs=64, enable_prefix_caching=False,
                              cpu_cores=cores, max_num_batched_tokens=budget)
    engine = start_engine(settings, "colocated")
    rng = np.random.default_rng(3)

    def fresh(n: int) -> list[int]:
        return [int(x) for x in rng.integers(10, 8000, size=n)]

    await asyncio.gather(*(_stream(engine, fresh(64), 8, []) for _ in range(2)))   # warm-up
    rows = []
    for batch, prompt_tokens in itertools.product(decodes, prompts):
        for _ in range(REPEATS):
            marks = [[] for _ in range(batch)]
            tasks = [asyncio.create_task(_stream(engine, fresh(DECODE_PROMPT_TOKENS), DECODE_MAX_TOKENS, m))
                     for m in marks]
            while batch and min((m[-1][1] if m else 0) for m in marks) < 4:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5 if batch else 0.2)
            submitted, prompt_marks = time.perf_counter(), []
            await _stream(engine, fresh(prompt_tokens), 1, prompt_marks)
            await asyncio.gather(*tasks)
            steps = [s for s in (_step_before_s(m, submitted) for m in marks) if s]
            rows.append({"cores": cores, "budget": budget, "decodes": batch, "prompt_tokens": prompt_tokens,
                         "ttft_s": prompt_marks[-1][0] - submitted,
                         "decode_step_before_s": statistics.median(steps) if steps else None,
                         "context_tokens": sum(DECODE_PROMPT_TOKENS + max([n for t, n in m if t <= submitted] or [0])
                                               for m in marks)})
    engine.shutdown()
    return rows


def summary(rows: list[dict], model) -> tuple[list[dict], str]:
    """Per case: the measured mean and the model's prediction, and a table of them."""
    from pdserve.cpu_placement import parse_cores

    cases: dict[tuple, list[dict]] = {}
    for row in rows:
        cases.setdefault((row["cores"], row["budget"], row["decodes"], row["prompt_tokens"]), []).append(row)
    out = []
    lines = ["| cores | budget | decodes | prompt | TTFT measured (s) | model (s) | error | decode step before: "
             "measured (s) | model (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for (cores, budget, batch, prompt_tokens), own in cases.items():
        engine = model.on_devices(len(parse_cores(cores)))
        measured = statistics.mean(r["ttft_s"] for r in own)
        context = round(statistics.mean(r["context_tokens"] for r in own))
        predicted = predicted_ttft_s(engine, prompt_tokens, budget, batch, context)
        steps = [r["decode_step_before_s"] for r in own if r["decode_step_before_s"]]
        step = statistics.mean(steps) if steps else None
        step_model = engine.decode_step_s(batch, context) if batch else None
        out.append({"cores": cores, "budget": budget, "decodes": batch, "prompt_tokens": prompt_tokens,
                    "ttft_s": measured, "predicted_ttft_s": predicted, "decode_step_s": step,
                    "predicted_decode_step_s": step_model})
        show = (lambda v: "-" if v is None else f"{v:.3f}")  # noqa: E731
        lines.append(f"| {cores} | {budget} | {batch} | {prompt_tokens} | {measured:.3f} | {predicted:.3f} | "
                     f"{(predicted / measured - 1) * 100:+.0f}% | {show(step)} | {show(step_model)} |")
    return out, "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, help="the profile whose fitted model predicts (one of this host kind)")
    parser.add_argument("--cores", default="1,0-1", help="each engine's cores, comma-separated, each a core or a "
                        "range A-B (default 1,0-1: one core, then both)")
    parser.add_argument("--budgets", default="2048,512", help="tokens a step (max_num_batched_tokens), comma-separated "
                        "(default 2048,512: vLLM's CPU default and a small chunk)")
    parser.add_argument("--decodes", default="0,4,16", help="running decodes beside the prompt (default 0,4,16)")
    parser.add_argument("--prompts", default="1000,2000", help="prompt lengths in tokens (default 1000,2000)")
    parser.add_argument("--model", default="models/bench", help="model directory (default models/bench)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/mixed_step"), help="output directory")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # a child: CORES:BUDGET
    return parser.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        cores, budget = args.one.rsplit(":", 1)
        rows = asyncio.run(one_engine(cores, int(budget), _ints(args.decodes), _ints(args.prompts), args.model))
        (args.out / f"rows_{cores}_{budget}.json").write_text(json.dumps(rows))
        return 0
    from planner.perf_model import fit_perf_model
    from planner.profile import load_profile

    model = fit_perf_model(load_profile(args.profile)).model
    rows = []
    for cores, budget in itertools.product(args.cores.split(","), _ints(args.budgets)):
        print(f"engine on cores {cores}, {budget} tokens a step ...", flush=True)
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", f"{cores}:{budget}"], check=True,
                       stdout=subprocess.DEVNULL)
        written = args.out / f"rows_{cores}_{budget}.json"
        rows += json.loads(written.read_text())
        written.unlink()
    cases, table = summary(rows, model)
    (args.out / "mixed_step.json").write_text(json.dumps({"profile": args.profile, "rows": rows, "cases": cases},
                                                         indent=1))
    (args.out / "mixed_step.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
