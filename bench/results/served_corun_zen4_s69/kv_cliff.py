"""(run from the repo root: python bench/results/served_corun_zen4_s69/kv_cliff.py; three runs of it are in kv_cliff.txt)
Does the decode point (64, 2015) preempt? The engine probe at 64 x 2015 (64 blocks each: 4,096 of
the 4,095 vLLM lends) against 64 x 1983 (63 blocks each) and 32 x 2015, the profile's engine."""
import asyncio, os, sys, time
sys.path.insert(0, os.getcwd())

async def main():
    from pdserve.engine import EngineSettings, start_engine
    from planner.profiler.engine_probe import EngineProbe
    settings = EngineSettings(model="models/tiny", block_size=32, max_model_len=2048, kv_cache_bytes=256 << 20,
                              enable_prefix_caching=False, cpu_cores="1")
    engine = start_engine(settings, "colocated")
    try:
        probe = EngineProbe(engine, int(engine.vllm_config.model_config.get_vocab_size()), seed=3)
        await probe.warm_up()
        for batch, context in ((32, 2015), (64, 1983), (64, 2015), (64, 1983), (64, 2015), (64, 1024), (64, 1500), (48, 2015), (64, 1750), (40, 2015), (56, 2015)):
            m = await probe.decode(batch, context, 32)
            print(f"batch {batch} x {context}: step {m.step_s * 1e3:.1f} ms", flush=True)
    finally:
        engine.shutdown()

if __name__ == "__main__":
    asyncio.run(main())
