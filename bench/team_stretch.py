"""How much a load on one core slows an engine whose threads span two: the host model's team stretch.

    .venv/bin/python bench/team_stretch.py --model models/bench --out bench/results/team_stretch

An engine bound to cores 0-1 (vLLM's CPU backend runs one OpenMP thread per core, which meet at a
barrier after every layer) decodes a batch while a burner process bound to core 1 alone runs for
`duty` of every 10 ms and sleeps the rest, for duty 0 (no burner), 0.1, 0.2 and 0.3; then the same
with a one-core engine on core 1. Per duty: the decode step time and its stretch over the step with
no burner, beside the two predictions of `planner.simulator.host.stretch_for_loads`: processor
sharing over the cores the step spans (1 / (1 - duty / 2) for the two-core engine: what the model
charged before) and the team stretch (1 / (1 - duty): the load on any of its cores holds the whole
step). Rounds alternate the duties, several times, and the median of each is kept: the machine's
drift lands on every duty alike. Writes team_stretch.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

PERIOD_S = 0.010
DUTIES = (0.0, 0.1, 0.2, 0.3)


def burn(core: int, duty: float, stop) -> None:
    """Busy for `duty` of every PERIOD_S on `core`, asleep the rest, until `stop` is set."""
    os.sched_setaffinity(0, {core})
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < duty * PERIOD_S:
            pass
        time.sleep(max(0.0, (1 - duty) * PERIOD_S))


async def steps(settings, batch: int, context: int, rounds: int, burner_core: int) -> dict[float, list[float]]:
    from planner.profiler.job import _on_engine

    async def work(engine, probe):
        await probe.warm_up()
        measured: dict[float, list[float]] = {duty: [] for duty in DUTIES}
        for round_ in range(rounds):
            for duty in DUTIES:
                stop, burner = multiprocessing.Event(), None
                if duty > 0:
                    burner = multiprocessing.Process(target=burn, args=(burner_core, duty, stop), daemon=True)
                    burner.start()
                    await asyncio.sleep(0.2)
                try:
                    m = await probe.decode(batch, context, 48)
                finally:
                    stop.set()
                    if burner is not None:
                        burner.join()
                measured[duty].append(m.step_s)
            print(f"  round {round_ + 1}/{rounds}: " + ", ".join(f"{d:g}: {v[-1] * 1e3:.2f} ms" for d, v in measured.items()),
                  flush=True)
        return measured

    return await _on_engine(settings, work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory (pdserve make-model)")
    parser.add_argument("--batch", type=int, default=8, help="sequences decoding together")
    parser.add_argument("--context", type=int, default=128, help="prompt tokens of each sequence")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over every duty (medians kept)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    args = parser.parse_args()

    from pdserve.engine import EngineSettings

    base = EngineSettings(model=args.model, max_model_len=2048, kv_cache_bytes=512 << 20, enable_prefix_caching=False)
    rows = []
    for name, cores, team in (("two-core engine", "0-1", 2), ("one-core engine", "1", 1)):
        print(f"{name} on cores {cores}, burner on core 1", flush=True)
        measured = asyncio.run(steps(replace(base, cpu_cores=cores), args.batch, args.context, args.rounds, 1))
        alone = statistics.median(measured[0.0])
        for duty in DUTIES:
            step = statistics.median(measured[duty])
            rows.append({"engine": name, "team_cores": team, "duty": duty, "step_ms": step * 1e3,
                         "stretch": step / alone, "processor_sharing": 1 / (1 - duty / team),
                         "team": 1 / (1 - duty), "samples_ms": [s * 1e3 for s in measured[duty]]})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "team_stretch.json").write_text(json.dumps({"batch": args.batch, "context": args.context,
                                                             "rows": rows}, indent=1))
    lines = ["| engine | burner's duty on core 1 | decode step (ms) | stretch measured | processor sharing "
             "over its cores | team stretch |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['engine']} | {r['duty']:.0%} | {r['step_ms']:.2f} | {r['stretch']:.3f} | "
              f"{r['processor_sharing']:.3f} | {r['team']:.3f} |" for r in rows]
    (args.out / "team_stretch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, marker in (("two-core engine", "o"), ("one-core engine", "s")):
        sel = [r for r in rows if r["engine"] == name]
        ax.plot([r["duty"] for r in sel], [r["stretch"] for r in sel], marker=marker, label=f"{name}: measured")
    two = [r for r in rows if r["team_cores"] == 2]
    ax.plot([r["duty"] for r in two], [r["processor_sharing"] for r in two], "k--", label="processor sharing over 2 cores")
    ax.plot([r["duty"] for r in two], [r["team"] for r in two], "k:", label="team stretch 1 / (1 - duty)")
    ax.set_xlabel("burner's duty on core 1")
    ax.set_ylabel("decode step / step with no burner")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "team_stretch.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
