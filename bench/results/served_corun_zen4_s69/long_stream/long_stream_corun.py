"""(run from the repo root: python bench/results/served_corun_zen4_s69/long_stream/long_stream_corun.py)
One-off: the prompt-loss probes' decode side with one stream, at a short and at a long context, ABAB.
The profile's probe streams 128-token contexts at 2, 8 and 32 streams and read ~1.0 beside prompts
on this VM, where long-short's one-sequence, 1.4k-token steps ran 1.11-1.22x beside long prompts.
Here: the same probes (prompts of 512, 1024 and 1433 tokens, 0.3 s apart) beside 1 stream whose
prompt is 128 tokens (short) or 1433 (long), and beside 2 short streams (the probe's own row),
rounds alternating; each window's decode steps a prompt step covered against those it left alone
(`planner.validation_steps.corun_by_batch`). Prints each window's row and writes result.json."""
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.getcwd())

OUT = Path(__file__).resolve().parent


def main() -> None:
    from launch.local import ClusterSpec, LocalCluster
    from pdserve.engine import EngineSettings
    from pdserve.engine_step_trace import engine_steps
    from planner.profiler import prompt_loss_probe
    from planner.profiler.serving_probe import traced_engines
    from planner.validation_steps import corun_by_batch

    engine = EngineSettings(model="models/tiny", block_size=32, max_model_len=2048, kv_cache_bytes=256 << 20,
                            enable_prefix_caching=False)
    spec = ClusterSpec(engine=engine, transport="shm", cpu_cores={"prefill": "0", "decode": "1"})
    cases = [("1 short", 1, 128), ("1 long", 1, 1433), ("2 short", 2, 128)]
    results = []
    with tempfile.TemporaryDirectory(prefix="pdserve-long-stream-") as trace_dir, \
            traced_engines(Path(trace_dir)), LocalCluster(spec) as cluster:
        ids = cluster.worker_ids("prefill")[0], cluster.worker_ids("decode")[0]
        windows = []
        for round_index in range(4):
            for name, batch, context in (cases if round_index % 2 == 0 else cases[::-1]):
                prompt_loss_probe.BATCH_PROMPT_TOKENS = context
                window = asyncio.run(prompt_loss_probe.probes_beside_streams(
                    cluster.grpc_target, batch, (512, 1024, 1433), 3, 250, 2048 - context - 8, seed=round_index))
                windows.append((name, round_index, window))
                print(f"round {round_index + 1}: {name} done", flush=True)
        prefill, decode = engine_steps(trace_dir, ids[0]), engine_steps(trace_dir, ids[1])
    for name, round_index, (start, end) in windows:
        inside = lambda steps: [s for s in steps if start <= s.start_s < end]  # noqa: E731
        for row in corun_by_batch(inside(decode), inside(prefill), min_steps=10):
            results.append({"case": name, "round": round_index + 1, "batch": row.batch, "beside_ms": row.beside_s * 1e3,
                            "alone_ms": row.alone_s * 1e3, "beside_steps": row.beside_steps,
                            "alone_steps": row.alone_steps, "ratio": row.ratio})
            print(f"{name:8s} round {round_index + 1} batch {row.batch}: beside {row.beside_s * 1e3:.2f} ms "
                  f"({row.beside_steps}) alone {row.alone_s * 1e3:.2f} ms ({row.alone_steps}) -> {row.ratio:.3f}")
    (OUT / "result.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
