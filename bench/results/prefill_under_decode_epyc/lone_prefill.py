"""One-core prefill: the engine alone (as the profile measures it) against the prefill worker of a
running 1P+1D cluster, idle and while the decode worker streams 8 requests. Same session, same cores."""
import asyncio, json, statistics, sys, time
from pathlib import Path
REPO = Path(__file__).resolve().parents[3]   # bench/results/prefill_under_decode_epyc/ -> the checkout
sys.path.insert(0, str(REPO))
import numpy as np

LENGTHS, REPEATS = (256, 1024, 2000), 4
SETTINGS = dict(model=str(REPO / "models" / "bench"), dtype="bfloat16", max_model_len=4096, kv_cache_bytes=512 << 20,
                max_num_seqs=64, enable_prefix_caching=False)

async def engine_alone():
    from pdserve.engine import EngineSettings, start_engine
    from planner.profiler.engine_probe import EngineProbe
    e = start_engine(EngineSettings(**SETTINGS, cpu_cores="0"), "colocated")
    p = EngineProbe(e, 8192, seed=1)
    await p.warm_up()
    out = {n: await p.prefill_s(n, REPEATS) for n in LENGTHS}
    e.shutdown()
    return out

async def lone(target, rng, label):
    from pdserve.client import AsyncClient
    out = {}
    async with AsyncClient(target) as client:
        for n in LENGTHS:
            ttfts = []
            for _ in range(REPEATS):
                await asyncio.sleep(0.3)
                ids = [int(i) for i in rng.integers(10, 8192, size=n)]
                t0 = time.perf_counter()
                async for chunk in client.generate(token_ids=ids, max_tokens=2, ignore_eos=True, temperature=0.0):
                    ttfts.append(time.perf_counter() - t0)
                    break
            out[n] = statistics.median(ttfts)
    print(label, {n: round(v * 1e3, 1) for n, v in out.items()}, flush=True)
    return out

async def with_decodes(target, rng):
    from pdserve.client import AsyncClient
    stop = asyncio.Event()
    async def stream(i):
        async with AsyncClient(target) as client:
            while not stop.is_set():
                ids = [int(x) for x in rng.integers(10, 8192, size=64)]
                async for _ in client.generate(token_ids=ids, max_tokens=1500, ignore_eos=True, temperature=0.0):
                    if stop.is_set():
                        break
    tasks = [asyncio.create_task(stream(i)) for i in range(8)]
    await asyncio.sleep(5)
    out = await lone(target, rng, "cluster, 8 decoding")
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return out

def main():
    from pdserve.engine import EngineSettings
    from launch.commands import ClusterSpec
    from launch.local import LocalCluster
    alone = asyncio.run(engine_alone())
    print("engine alone", {n: round(v * 1e3, 1) for n, v in alone.items()}, flush=True)
    spec = ClusterSpec(engine=EngineSettings(**SETTINGS), transport="shm", cpu_cores={"prefill": "0", "decode": "1"})
    rng = np.random.default_rng(3)
    with LocalCluster(spec) as cluster:
        asyncio.run(lone(cluster.grpc_target, rng, "warm-up"))
        idle = asyncio.run(lone(cluster.grpc_target, rng, "cluster, idle"))
        busy = asyncio.run(with_decodes(cluster.grpc_target, rng))
        idle2 = asyncio.run(lone(cluster.grpc_target, rng, "cluster, idle again"))
    for n in LENGTHS:
        print(f"{n:5d} tokens: alone {alone[n]*1e3:7.1f} ms; cluster idle x{idle[n]/alone[n]:.3f}, x{idle2[n]/alone[n]:.3f}; 8 decoding x{busy[n]/alone[n]:.3f}")
    json.dump({"alone": alone, "idle": idle, "busy": busy, "idle2": idle2}, open(Path(__file__).with_name("lone_prefill.json"), "w"), indent=1)

if __name__ == "__main__":
    main()
