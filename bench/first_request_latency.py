"""The first request of each kind after a cluster starts against the second, with pdserve's eager
logprob ranks and with vLLM's compiled ones, side by side in one run. Run `--help`."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("eager", "compiled")   # PDSERVE_VLLM_EAGER_RANKS 1 / 0 (pdserve.vllm_plugin, "Logprob ranks")
KINDS = {   # what each kind adds to a greedy 12-token completion of PROMPT
    "greedy": {},
    "logprobs": {"logprobs": 2},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "seeded": {"temperature": 1.0, "seed": 7},
    "penalties": {"presence_penalty": 0.5, "repetition_penalty": 1.2},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "maxLength": 4}}, "required": ["a"]}}}},
}
PROMPT = "The history of the city begins with"

DESCRIPTION = """\
A request that is the first of its kind on a worker can pay one-time costs the second does not: on
CPU, vLLM's sampler compiled its logprob-rank count with torch.compile at the first request asking
for logprobs, in each engine (pdserve's vLLM plugin now counts eagerly; PDSERVE_VLLM_EAGER_RANKS=0
restores vLLM's compiled count). This measures it on this host: per round a fresh 1P+1D cluster
(tcp, prefill on core 0, decode on core 1) with --model, the arms in ABBA order over --rounds; in
each, every kind of request (KINDS: greedy, logprobs, prompt logprobs, seeded, penalties, a JSON
schema) sent twice through the OpenAI HTTP API, one at a time, in that order; each request's wall
time at the client.

Writes rounds.json, summary.json (per arm and kind: median first and second request, and their
difference, the cold cost) and a PNG to --out; prints the summary.
"""


@dataclass(frozen=True)
class Round:
    arm: str
    seconds: dict[str, list[float]]   # kind -> [first, second] request's wall seconds


def abba(arms: tuple[str, ...], rounds: int) -> list[str]:
    """The arms in ABBA order over `rounds` rounds: drift in the host's speed falls on both."""
    return [arm for index in range(rounds) for arm in (arms if index % 2 == 0 else arms[::-1])]


def summarize(rounds: list[Round]) -> dict[str, dict[str, dict[str, float]]]:
    """arm -> kind -> {first_s, second_s, cold_s}: medians over the arm's rounds; cold_s is the
    median of each round's first minus second."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm in dict.fromkeys(r.arm for r in rounds):
        mine = [r for r in rounds if r.arm == arm]
        out[arm] = {kind: {"first_s": statistics.median(r.seconds[kind][0] for r in mine),
                           "second_s": statistics.median(r.seconds[kind][1] for r in mine),
                           "cold_s": statistics.median(r.seconds[kind][0] - r.seconds[kind][1] for r in mine)}
                    for kind in mine[0].seconds}
    return out


def run_round(model: Path, arm: str, log_dir: Path) -> Round:
    import httpx

    from launch.commands import ClusterSpec
    from launch.local import LocalCluster
    from pdserve.engine import EngineSettings
    from pdserve.vllm_plugin import EAGER_RANKS_ENV

    os.environ[EAGER_RANKS_ENV] = "1" if arm == "eager" else "0"   # the workers inherit it
    settings = EngineSettings(model=str(model), block_size=32, max_model_len=2048, kv_cache_bytes=64 << 20,
                              max_num_seqs=16)
    spec = ClusterSpec(engine=settings, transport="tcp", cpu_cores={"prefill": "0", "decode": "1"},
                       log_dir=str(log_dir))
    seconds: dict[str, list[float]] = {}
    with LocalCluster(spec) as cluster:
        for kind, extra in KINDS.items():
            body = {"model": model.name, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0} | extra
            for _ in range(2):
                started = time.perf_counter()
                reply = httpx.post(f"{cluster.http_url}/v1/completions", json=body, timeout=120)
                seconds.setdefault(kind, []).append(time.perf_counter() - started)
                if reply.status_code != 200:
                    raise RuntimeError(f"{kind}: {reply.status_code} {reply.text[:300]}")
    return Round(arm, seconds)


def plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(next(iter(summary.values())))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / (2 * len(summary))
    for index, (arm, rows) in enumerate(summary.items()):
        for which, hatch in (("first_s", ""), ("second_s", "//")):
            offset = (2 * index + (which == "second_s")) * width
            ax.bar([k + offset for k in range(len(kinds))], [rows[kind][which] for kind in kinds], width,
                   label=f"{arm}: {which[:-2]} request", hatch=hatch, color=f"C{index}", alpha=0.9 if hatch else 1)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], kinds)
    ax.set_ylabel("seconds at the client")
    ax.set_yscale("log")
    ax.set_title("first vs second request of each kind on a fresh 1P+1D cluster")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO / "models" / "tiny", help="a model directory (default: tiny)")
    parser.add_argument("--rounds", type=int, default=2, help="clusters per arm (default 2, ABBA)")
    parser.add_argument("--out", type=Path, required=True, help="folder for rounds.json, summary.json and the PNG")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = []
    order = abba(ARMS, args.rounds)
    for index, arm in enumerate(order):
        print(f"[{index + 1}/{len(order)}] {arm}: a fresh cluster, {len(KINDS)} kinds twice", flush=True)
        rounds.append(run_round(args.model, arm, Path(tempfile.mkdtemp(prefix=f"first-request-{arm}-"))))
    summary = summarize(rounds)
    (args.out / "rounds.json").write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, args.out / "first_request_latency.png")
    for arm, rows in summary.items():
        for kind, row in rows.items():
            print(f"{arm:9s} {kind:16s} first {row['first_s'] * 1e3:8.1f} ms  second {row['second_s'] * 1e3:7.1f} ms"
                  f"  cold {row['cold_s'] * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
