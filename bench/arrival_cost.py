"""What requests arriving at a 1P+1D cluster cost a prompt being computed on the prefill core:

    python bench/arrival_cost.py --out bench/results/arrival_cost

A request is taken in at once on the prefill worker's core (the router bound there admits it and
makes the Prefill RPC, the worker's API process hands it to vLLM, vLLM's engine core reads it),
whatever that core computes, so a long prompt computing there finishes later. The simulator
charges the prefill worker's CPU per request to the request's own first step and the router's as
an average load; this measures the delay itself, by how many requests arrive and how close together.

Per round: a long prompt (`--prompt-tokens`) alone, then the same length with k short requests
(32 tokens) sent while it computes: `spaced` evenly between 30% and 70% of the lone prompt's time
to first token, or `burst`, all at 30%. Per case (k, spacing), the first token's delay (median with
minus median alone) and the delay per arrival. One cluster (`launch.local`, the `pdserve up`
defaults: shm, the router on the prefill core), the tiny model unless `--model`. Writes
arrival_cost.json, arrival_cost.md and arrival_cost.png. About 3 minutes on a 2-vCPU EPYC.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHORT_PROMPT_TOKENS = 32
FIRST_AT, LAST_AT = 0.3, 0.7  # when arrivals go, as shares of the lone prompt's time to first token


def arrival_offsets_s(spacing: str, arrivals: int, alone_s: float) -> list[float]:
    """When each of `arrivals` short requests is sent after the long prompt, in seconds."""
    if spacing == "burst" or arrivals == 1:
        return [FIRST_AT * alone_s] * arrivals
    step = (LAST_AT - FIRST_AT) / (arrivals - 1)
    return [(FIRST_AT + i * step) * alone_s for i in range(arrivals)]


def summarize(rows: list[dict]) -> list[dict]:
    """Per case (arrivals, spacing) but the lone one: the median delay and the delay per arrival,
    each round's lone time to first token against its own rounds' median."""
    alone = statistics.median(row["alone_s"] for row in rows)
    cases: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        cases.setdefault((row["arrivals"], row["spacing"]), []).append(row["with_s"])
    out = []
    for (arrivals, spacing), times in sorted(cases.items()):
        delay = statistics.median(times) - alone
        out.append({"arrivals": arrivals, "spacing": spacing, "rounds": len(times), "alone_s": alone,
                    "delay_s": delay, "delay_per_arrival_s": delay / arrivals})
    return out


async def measure(target: str, prompt_tokens: int, cases: list[tuple[int, str]], rounds: int, vocab_size: int,
                  ) -> list[dict]:
    import numpy as np

    from pdserve.client import AsyncClient
    from planner.profiler.serving_probe import token_times

    rng = np.random.default_rng(5)

    def ids(n: int) -> list[int]:
        return [int(i) for i in rng.integers(10, vocab_size, size=n)]

    rows = []
    async with AsyncClient(target) as client:
        for _ in range(3):  # warm-up
            await token_times(client, ids(prompt_tokens), 1)
        for round_index in range(rounds):
            for arrivals, spacing in cases:
                await asyncio.sleep(0.25)
                sent = time.perf_counter()
                alone_s = (await token_times(client, ids(prompt_tokens), 1))[0] - sent
                await asyncio.sleep(0.25)
                sent = time.perf_counter()
                long = asyncio.create_task(token_times(client, ids(prompt_tokens), 1))
                shorts = []
                for offset_s in arrival_offsets_s(spacing, arrivals, alone_s):
                    await asyncio.sleep(max(0.0, sent + offset_s - time.perf_counter()))
                    shorts.append(asyncio.create_task(token_times(client, ids(SHORT_PROMPT_TOKENS), 1)))
                with_s = (await long)[0] - sent
                await asyncio.gather(*shorts)
                rows.append({"round": round_index, "arrivals": arrivals, "spacing": spacing, "alone_s": alone_s,
                             "with_s": with_s})
            print(f"round {round_index + 1}/{rounds} done", flush=True)
    return rows


def table(summary: list[dict]) -> str:
    lines = ["| arrivals | spacing | rounds | first token alone (ms) | delay (ms) | per arrival (ms) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {s['arrivals']} | {s['spacing']} | {s['rounds']} | {s['alone_s'] * 1e3:.1f} | "
              f"{s['delay_s'] * 1e3:.1f} | {s['delay_per_arrival_s'] * 1e3:.1f} |" for s in summary]
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for spacing, marker in (("spaced", "o"), ("burst", "s")):
        points = [s for s in summary if s["spacing"] == spacing]
        ax.plot([s["arrivals"] for s in points], [s["delay_per_arrival_s"] * 1e3 for s in points], marker=marker,
                label=spacing)
    ax.set_xlabel("short requests arriving during the prompt")
    ax.set_ylabel("first token's delay per arrival (ms)")
    ax.set_title("what an arrival costs a prompt on the prefill core")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny", help="model directory (default models/tiny)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="the long prompt's tokens (default 1024)")
    parser.add_argument("--arrivals", default="1,2,4,8", help="short requests per case, comma-separated "
                        "(default 1,2,4,8)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of every case (default 8)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/arrival_cost"), help="output directory")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from launch.local import ClusterSpec, LocalCluster
    from pdserve.client import Client
    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings

    args.out.mkdir(parents=True, exist_ok=True)
    engine = EngineSettings(model=args.model, dtype=resolve_auto_dtype(args.model, "0").dtype, max_model_len=2048,
                            kv_cache_bytes=256 << 20, max_num_seqs=64, enable_prefix_caching=False)
    cases = [(int(k), spacing) for k in args.arrivals.split(",") for spacing in ("spaced", "burst")
             if not (int(k) == 1 and spacing == "burst")]
    spec = ClusterSpec(engine=engine, transport="shm", cpu_cores={"prefill": "0", "decode": "1"})
    with LocalCluster(spec) as cluster:
        with Client(cluster.grpc_target) as client:
            vocab_size = client.model_info().vocab_size
        rows = asyncio.run(measure(cluster.grpc_target, args.prompt_tokens, cases, args.rounds, vocab_size))
    summary = summarize(rows)
    (args.out / "arrival_cost.json").write_text(json.dumps({"prompt_tokens": args.prompt_tokens, "rows": rows,
                                                            "summary": summary}, indent=1))
    (args.out / "arrival_cost.md").write_text(table(summary))
    plot(summary, args.out / "arrival_cost.png")
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
