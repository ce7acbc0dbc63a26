"""vLLM's server (A) on both cores: client ITL at a steady batch vs the engine alone's decode step."""
import asyncio, json, subprocess, sys
from pathlib import Path
REPO = Path(__file__).resolve().parents[4]   # bench/results/mixed_step_xeon/a_served/ -> the checkout
sys.path.insert(0, str(REPO))
MODEL = str(REPO / "models" / "bench")

def served():
    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings
    from loadgen.vllm_server import VllmOpenAIServer
    s = EngineSettings(model=MODEL, dtype=resolve_auto_dtype(MODEL, "0").dtype, max_model_len=4096, kv_cache_bytes=1024 << 20,
                       max_num_seqs=64, enable_prefix_caching=False, cpu_cores="0-1")
    out = {}
    with VllmOpenAIServer(s, log_path=Path("/tmp/a_served_vllm.log")) as server:
        for conc in (4, 16):
            label = f"a_c{conc}"
            subprocess.run([str(REPO / ".venv" / "bin" / "pdserve"), "load", "--target", server.url, "--concurrency", str(conc),
                            "--input-len", "256", "--output-len", "100", "--range-ratio", "0", "--num-prompts", str(conc * 3),
                            "--output-dir", "/tmp/a_served", "--label", label, "--no-progress"], check=True, stdout=subprocess.DEVNULL)
            d = json.load(open(f"/tmp/a_served/{label}.json"))
            out[conc] = {k: d[k] for k in ("median_itl_ms", "median_tpot_ms", "p90_itl_ms")}
            print("served", conc, out[conc], flush=True)
    return out

async def alone():
    from pdserve.dtype_probe import resolve_auto_dtype
    from pdserve.engine import EngineSettings, start_engine
    from planner.profiler.engine_probe import EngineProbe
    s = EngineSettings(model=MODEL, dtype=resolve_auto_dtype(MODEL, "0").dtype, max_model_len=4096, kv_cache_bytes=1024 << 20,
                       max_num_seqs=64, enable_prefix_caching=False, cpu_cores="0-1")
    e = start_engine(s, "colocated")
    p = EngineProbe(e, 8192, seed=1)
    await p.warm_up()
    r = {b: [(await p.decode(b, 256, 96)).step_s * 1000 for _ in range(2)] for b in (4, 16)}
    print("alone (uni)", r, flush=True)
    e.shutdown()

if __name__ == "__main__":
    if sys.argv[1:] == ["alone"]:
        asyncio.run(alone())
    else:
        served()
