"""A/B of the served-step reading on one VM state: batched runs of 256 outputs, each read as the
old probe did (the common window of a 64-token output: up to the first request's 64th token) and as
the new one does (the late half of the 256-token common window); each reading's fitted line
(served - engine = a + b*B, the profile's own engine table and fit) then predicts the served steps
of streams that keep decoding (bench/stream_cpu.py's rows, run right after)."""
import asyncio, json, statistics, sys, time
from pathlib import Path
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
import numpy as np
from launch.commands import ClusterSpec
from launch.local import LocalCluster
from pdserve.client import AsyncClient, Client
from pdserve.engine import EngineSettings
from planner.profile import load_profile
from planner.perf_model import fit_perf_model
from planner.profiler.stream_fit import BATCH_PROMPT_TOKENS, engine_step_s

def reading(runs, start, end, batch):
    gaps = [b - a for marks in runs for a, b in zip(marks, marks[1:]) if a >= start and b <= end]
    generated = statistics.median(sum(1 for t in marks if t <= (start + end) / 2) for marks in runs)
    return statistics.median(gaps), batch * (BATCH_PROMPT_TOKENS + generated)

async def batched(target, batch, vocab, seed, out=256):
    rng = np.random.default_rng(seed)
    prompts = [[int(i) for i in rng.integers(10, vocab, size=BATCH_PROMPT_TOKENS)] for _ in range(batch)]
    async def stream(client, ids):
        marks = []
        async for chunk in client.generate(token_ids=ids, max_tokens=out, ignore_eos=True, temperature=0.0):
            marks += [time.perf_counter()] * len(chunk.token_ids)
        return marks
    async with AsyncClient(target) as client:
        return await asyncio.gather(*(stream(client, ids) for ids in prompts))

def main():
    prof = load_profile(sys.argv[1]); model = fit_perf_model(prof).model; rows = prof.decode
    engine = EngineSettings(model=str(REPO / "models/tiny"), max_model_len=2048, kv_cache_bytes=256 << 20, enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, transport="shm", cpu_cores={"prefill": "0", "decode": "1"})
    out = {"old": [], "new": []}
    with LocalCluster(spec) as cluster:
        with Client(cluster.grpc_target) as c:
            vocab = c.model_info().vocab_size
        for rep in range(2):
            for batch in (1, 4, 8, 16, 32, 64):
                runs = asyncio.run(batched(cluster.grpc_target, batch, vocab, 100 + rep))
                start = max(m[1] for m in runs)
                old_end = min(m[63] for m in runs); end = min(m[-1] for m in runs)
                for name, (s, e) in (("old", (start, old_end)), ("new", ((start + end) / 2, end))):
                    if e <= s: print(name, batch, "no window"); continue
                    step, ctx = reading(runs, s, e, batch)
                    out[name].append((batch, ctx, step, engine_step_s(batch, ctx, model, rows)))
                print(rep, batch, {k: [round(x * 1e3, 2) if i > 1 else round(x) for i, x in enumerate(v[-1])] for k, v in out.items()}, flush=True)
    json.dump(out, open(Path(__file__).with_suffix(".json"), "w"))
    for name, pts in out.items():
        B = np.array([p[0] for p in pts], float); R = np.array([p[2] - p[3] for p in pts])
        b, a = np.polyfit(B, R, 1)
        print(f"{name}: served - engine = {a*1e3:.2f} ms + {b*1e6:.0f} us x B")

if __name__ == "__main__":
    main()
