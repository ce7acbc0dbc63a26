"""Where vLLM runs the model on CPU: in its engine-core process ("uni", pdserve's default there) or
in a model-runner process of its own ("mp", vLLM's choice on CPU, `--vllm-executor mp`). One
colocated engine of the `bench` model on the given cores per run, the two executors alternated, each
run in a fresh process:

    python bench/executor_ab.py --cores 1 --rounds 2 --out bench/results/executor_ab

Per run: seconds until the engine serves, the processes under it, a prompt of 128 / 1,000 / 2,000
tokens alone (median of 5), the decode step at batch 1 and 16 (256-token prompts, 32 steps), and
the greedy tokens of four fixed prompts (which must match across executors). The dtype is the one
`pdserve up --dtype auto` runs on those cores (the probe's, cached per host kind). Writes one JSON per
run and a summary (executor_ab.md). About 90 s per run on a 2-vCPU Xeon.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMPTS = [[(17 * i + 7 * j) % 8000 + 10 for j in range(100 + 50 * i)] for i in range(4)]
FIGURES = ("up_s", "prefill_128_s", "prefill_1000_s", "prefill_2000_s", "decode_b1_step_s", "decode_b16_step_s")


async def one_run(executor: str, cores: str, model: str) -> dict:
    """Starts one engine with `executor`, measures it, shuts it down."""
    import time

    import psutil

    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings, start_engine
    from planner.profiler.engine_probe import EngineProbe

    dtype = resolve_auto_dtype(model, cores).dtype   # what `pdserve up --dtype auto` runs on these cores
    settings = EngineSettings(model=model, dtype=dtype, max_model_len=4096, kv_cache_bytes=512 << 20,
                              max_num_seqs=64, enable_prefix_caching=False, cpu_cores=cores, executor=executor)
    started = time.perf_counter()
    engine = start_engine(settings, "colocated")
    result = {"executor": executor, "cores": cores, "dtype": settings.dtype, "up_s": time.perf_counter() - started,
              "processes": [p.name() for p in psutil.Process().children(recursive=True)]}
    probe = EngineProbe(engine, 8192, seed=1)
    await probe.warm_up()
    for tokens in (128, 1000, 2000):
        result[f"prefill_{tokens}_s"] = await probe.prefill_s(tokens, 5)
    for batch in (1, 16):
        result[f"decode_b{batch}_step_s"] = (await probe.decode(batch, 256, 32)).step_s
    from vllm import SamplingParams

    from pdserve.engine import tokens_prompt

    result["tokens"] = []
    for index, prompt in enumerate(PROMPTS):
        async for output in engine.generate(tokens_prompt(prompt), SamplingParams(max_tokens=16, temperature=0.0),
                                            request_id=f"tokens-{index}"):
            last = output
        result["tokens"].append(list(last.outputs[0].token_ids))
    engine.shutdown()
    return result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", default="1", help="cores the engine is bound to (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each executor, alternated (default 2)")
    parser.add_argument("--model", default="models/bench", help="model directory (default models/bench)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/executor_ab"), help="output directory")
    parser.add_argument("--one", choices=("uni", "mp"), help=argparse.SUPPRESS)   # a child run
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        result = asyncio.run(one_run(args.one, args.cores, args.model))
        (args.out / f"{args.one}_{os.getpid()}.json").write_text(json.dumps(result))
        return 0
    runs = []
    for round_index in range(args.rounds):
        for executor in ("mp", "uni") if round_index % 2 == 0 else ("uni", "mp"):
            print(f"round {round_index + 1}/{args.rounds}: {executor} ...", flush=True)
            before = set(args.out.glob(f"{executor}_*.json"))
            subprocess.run([sys.executable, __file__, "--one", executor, "--cores", args.cores, "--model", args.model,
                            "--out", str(args.out)], check=True, stdout=subprocess.DEVNULL)
            (written,) = set(args.out.glob(f"{executor}_*.json")) - before
            runs.append(json.loads(written.read_text()))
    same_tokens = all(run["tokens"] == runs[0]["tokens"] for run in runs)
    lines = ["| executor | runs | " + " | ".join(FIGURES) + " |", "|---|---|" + "---|" * len(FIGURES)]
    for executor in ("mp", "uni"):
        own = [run for run in runs if run["executor"] == executor]
        cells = [" / ".join(f"{run[f]:.3f}" for run in own) for f in FIGURES]
        lines.append(f"| {executor} | {len(own)} | " + " | ".join(cells) + " |")
    summary = "\n".join(lines) + f"\n\ngreedy tokens identical across every run: {same_tokens}\n"
    (args.out / "executor_ab.md").write_text(summary)
    print(summary)
    return 0 if same_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
