"""Do engines on different cores slow each other? A prompt computed on one core alone and while
another engine decodes on the other core, and that decode alone and beside the prompts:

    python bench/corun.py --rounds 3 --out bench/results/corun

Two colocated engines of the `bench` model, one per core (`--prefill-core`, `--decode-core`), each
in a process of its own, coordinated through files in `--out`/signals. Per round: the prompt alone (median of
3 prefills of `--prompt-tokens`, the other engine idle), the decode alone (`--batch` requests of
256-token prompts, 48 steps; the step time), then the decode looping while the prompt is measured
again. The simulator assumes no such interference (a step's time depends on its own instance and the
host's unbound processes only, `planner.simulator.host`); a ratio together/alone above the rounds'
spread says it should not. Writes corun.json and corun.md. About 5 minutes on a 2-vCPU Xeon.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DECODE_CONTEXT_TOKENS, DECODE_STEPS, PREFILL_REPEATS = 256, 48, 3
SIGNALS = "signals"   # the subdirectory of --out the two engines and this process coordinate through


def ratios(alone: list[float], together: list[float]) -> list[float]:
    """together / alone per round: above 1, the other core's work slowed this one's."""
    if len(alone) != len(together) or not alone:
        raise ValueError(f"{len(alone)} rounds alone against {len(together)} together")
    return [t / a for a, t in zip(alone, together)]


def _wait(path: Path, children: list = ()) -> None:
    """Until `path` exists; raises if one of `children` (the engines' processes) has failed first."""
    while not path.exists():
        failed = [child.args[-1] for child in children if child.poll() not in (None, 0)]
        if failed:
            raise RuntimeError(f"the {', '.join(failed)} engine's process failed before {path.name}")
        time.sleep(0.05)


async def one_engine(role: str, args) -> None:
    """One side: starts its engine, then measures what the orchestrator's files ask, round by round."""
    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings, start_engine
    from planner.profiler.engine_probe import EngineProbe

    core = args.prefill_core if role == "prefill" else args.decode_core
    settings = EngineSettings(model=args.model, dtype=resolve_auto_dtype(args.model, core).dtype,
                              max_model_len=4096, kv_cache_bytes=512 << 20, max_num_seqs=64,
                              enable_prefix_caching=False, cpu_cores=core)
    engine = start_engine(settings, "colocated")
    probe = EngineProbe(engine, 8192, seed=int(core))
    await probe.warm_up()
    await probe.prefill_s(512, 1)
    out, files = {"dtype": settings.dtype, "alone": [], "together": []}, args.out / SIGNALS
    (files / f"ready_{role}").touch()
    for rnd in range(args.rounds):
        if role == "prefill":
            for phase in ("alone", "together"):
                _wait(files / f"go_{phase}_{rnd}")
                out[phase].append(await probe.prefill_s(args.prompt_tokens, PREFILL_REPEATS))
                (files / f"done_{phase}_{rnd}").touch()
        else:
            _wait(files / f"go_decode_{rnd}")
            out["alone"].append((await probe.decode(args.batch, DECODE_CONTEXT_TOKENS, DECODE_STEPS)).step_s)
            (files / f"done_decode_{rnd}").touch()
            _wait(files / f"load_{rnd}")
            steps = []
            while not (files / f"stop_{rnd}").exists():
                steps.append((await probe.decode(args.batch, DECODE_CONTEXT_TOKENS, DECODE_STEPS)).step_s)
            out["together"].append(statistics.median(steps))
            (files / f"stopped_{rnd}").touch()
    (files / f"{role}.json").write_text(json.dumps(out))
    engine.shutdown()


def orchestrate(args) -> dict:
    files = args.out / SIGNALS
    shutil.rmtree(files, ignore_errors=True)
    files.mkdir(parents=True)
    children = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--role", role],
                                 stdout=subprocess.DEVNULL) for role in ("prefill", "decode")]
    _wait(files / "ready_prefill", children)
    _wait(files / "ready_decode", children)
    for rnd in range(args.rounds):
        for go, done in ((f"go_alone_{rnd}", f"done_alone_{rnd}"), (f"go_decode_{rnd}", f"done_decode_{rnd}")):
            (files / go).touch()
            _wait(files / done, children)
        (files / f"load_{rnd}").touch()
        time.sleep(4)   # the decode batch prefilled and stepping
        (files / f"go_together_{rnd}").touch()
        _wait(files / f"done_together_{rnd}", children)
        (files / f"stop_{rnd}").touch()
        _wait(files / f"stopped_{rnd}", children)
        print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    for child in children:
        child.wait()
    result = {role: json.loads((files / f"{role}.json").read_text()) for role in ("prefill", "decode")}
    shutil.rmtree(files)
    return result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill-core", default="0", help="the core computing the prompts (default 0)")
    parser.add_argument("--decode-core", default="1", help="the core decoding (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alone / together (default 3)")
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="the prompt's length (default 2000)")
    parser.add_argument("--batch", type=int, default=16, help="requests decoding together (default 16)")
    parser.add_argument("--model", default="models/bench", help="model directory (default models/bench)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/corun"), help="output directory")
    parser.add_argument("--role", choices=("prefill", "decode"), help=argparse.SUPPRESS)   # a child
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.role:
        asyncio.run(one_engine(args.role, args))
        return 0
    result = orchestrate(args)
    prefill, decode = result["prefill"], result["decode"]
    rows = [("prompt", f"{args.prompt_tokens} tokens on core {args.prefill_core}", prefill),
            ("decode step", f"batch {args.batch} on core {args.decode_core}", decode)]
    lines = ["| what | where | alone (s) | together (s) | together / alone |", "|---|---|---|---|---|"]
    for name, where, runs in rows:
        lines.append(f"| {name} | {where} | " + " / ".join(f"{v:.3f}" for v in runs["alone"]) + " | "
                     + " / ".join(f"{v:.3f}" for v in runs["together"]) + " | "
                     + " / ".join(f"{r:.3f}" for r in ratios(runs["alone"], runs["together"])) + " |")
    summary = "\n".join(lines) + f"\n\n(dtype {prefill['dtype']})\n"
    (args.out / "corun.json").write_text(json.dumps(result, indent=1))
    (args.out / "corun.md").write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
