# Ad hoc (issue 15, BENCHMARKS "Across shapes on an AVX2-only EPYC (Zen 3)"): the serving probe's batched runs
# on a 1P+1D tiny cluster, their median gap against the tokens per second inside the common window.
# Run from the repository root with .venv/bin/python; edit the batch and output loops to repeat.
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from launch.commands import ClusterSpec
from launch.local import LocalCluster
from pdserve.client import Client
from pdserve.engine import EngineSettings
from planner.profiler.batched_runs import batched_decode_run

def main():
    engine = EngineSettings(model=str(REPO / "models" / "tiny"), max_model_len=2048, kv_cache_bytes=256 << 20,
                            enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, transport="shm", cpu_cores={"prefill": "0", "decode": "1"})
    with LocalCluster(spec) as cluster:
        with Client(cluster.grpc_target) as client:
            vocab = client.model_info().vocab_size
        for out in (128, 256):
            for batch in (32, 64):
                for rep in range(2):
                    try:
                        run = asyncio.run(batched_decode_run(cluster.grpc_target, batch, vocab, time.process_time, seed=100+rep, output_tokens=out))
                    except Exception as e:
                        print(f'out {out} batch {batch}: {e}', flush=True); continue
                    # throughput inside the window: tokens per request per second
                    per_seq_step = batch / run.tokens_per_s
                    gaps = sorted(run.gaps_s)
                    zero = sum(1 for g in gaps if g < 1e-4) / len(gaps)
                    print(f"out {out} batch {batch:3d}: median gap {run.step_s*1e3:6.2f} ms, window throughput step {per_seq_step*1e3:6.2f} ms, "
                          f"mean gap {statistics.mean(gaps)*1e3:6.2f}, zero-gaps {zero:.0%}, context {run.context_tokens:.0f}", flush=True)

if __name__ == "__main__":
    main()
