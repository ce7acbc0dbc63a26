"""How fast one engine is under a set of process-level choices (dtype, allocator, OpenMP runtime).

`bench/fast_defaults.py` compares pdserve's defaults with vLLM's on one host and core. Each
`Variant` runs in a fresh process (an allocator or an OpenMP runtime can only be chosen before a
process starts): `run_variant` starts `python -m planner.profiler.engine_speed` with the variant's
environment, which starts one colocated engine bound to the given cores and measures, through
`EngineProbe` (the path a worker's requests take):

- prefill of `prompt_tokens` fresh tokens alone (median of `repeats`);
- decode step time at each batch size, every sequence with `context_tokens` of prompt.

`speed_table` (pure) turns the results into ratios against a baseline variant.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pdserve.preload import Preload

VLLM_AUTO = "vllm-auto"   # the dtype vLLM picks itself for `--dtype auto` (not pdserve's measured choice)


@dataclass(frozen=True)
class Variant:
    """One configuration to measure. `dtype` is a concrete dtype or VLLM_AUTO; `preload` names the
    libraries of `pdserve.preload.LIBRARIES` put into LD_PRELOAD (none: vLLM's own choice)."""

    name: str
    dtype: str
    preload: tuple[str, ...] = ()
    vllm_spin_ms: float = -1.0   # pdserve's cap on vLLM's busy-polling (pdserve.vllm_plugin); -1: vLLM's own


@dataclass(frozen=True)
class SpeedResult:
    variant: str
    dtype: str                         # what the engine ran in
    ld_preload: str                    # the libraries in LD_PRELOAD the engine's processes started with
    prefill_s: float
    decode_step_s: dict[int, float] = field(default_factory=dict)   # batch size -> seconds per step

    def to_dict(self) -> dict:
        return asdict(self) | {"decode_step_s": {str(b): s for b, s in self.decode_step_s.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "SpeedResult":
        return cls(**(data | {"decode_step_s": {int(b): s for b, s in data["decode_step_s"].items()}}))


def variant_env(variant: Variant, found: Preload, base: dict[str, str]) -> dict[str, str]:
    """The environment of a variant's process: LD_PRELOAD with exactly the variant's libraries
    (raises if one is not installed: a comparison without it would be mislabelled)."""
    by_name = {_library_name(path): path for path in found.paths}
    missing = [name for name in variant.preload if name not in by_name]
    if missing:
        raise FileNotFoundError(f"variant {variant.name} preloads {', '.join(missing)}, not installed here: "
                                + "; ".join(found.missing.get(name, name) for name in missing))
    env = {key: value for key, value in base.items() if key != "LD_PRELOAD"}
    if variant.preload:
        env["LD_PRELOAD"] = ":".join(by_name[name] for name in variant.preload)
    return env


def _library_name(path: str) -> str:
    return "iomp5" if "libiomp5" in path else "tcmalloc" if "tcmalloc" in path else Path(path).name


def run_variant(variant: Variant, model: str, cores: str, out: Path, found: Preload, prompt_tokens: int,
                batch_sizes: tuple[int, ...], context_tokens: int, steps: int, repeats: int,
                timeout_s: float = 900.0) -> SpeedResult:
    """Measures `variant` in a fresh process bound to `cores`; its log goes next to `out`."""
    argv = [sys.executable, "-m", "planner.profiler.engine_speed", "--model", model, "--cores", cores,
            "--dtype", variant.dtype, "--variant", variant.name, "--out", str(out),
            "--vllm-spin-ms", f"{variant.vllm_spin_ms:g}",
            "--prompt-tokens", str(prompt_tokens), "--batch-sizes", ",".join(map(str, batch_sizes)),
            "--context-tokens", str(context_tokens), "--steps", str(steps), "--repeats", str(repeats)]
    env = variant_env(variant, found, dict(os.environ)) | {"VLLM_LOGGING_LEVEL": "WARNING"}
    out.unlink(missing_ok=True)
    with open(out.with_suffix(".log"), "w") as log:
        run = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
    if run.returncode != 0 or not out.exists():
        raise RuntimeError(f"variant {variant.name} failed (exit {run.returncode}); see {out.with_suffix('.log')}")
    return SpeedResult.from_dict(json.loads(out.read_text()))


def median_result(results: list[SpeedResult]) -> SpeedResult:
    """One variant's repeated runs as one: the median of each time."""
    import statistics

    first = results[0]
    if any(r.variant != first.variant for r in results):
        raise ValueError("median_result takes the runs of one variant")
    return SpeedResult(first.variant, first.dtype, first.ld_preload,
                       statistics.median(r.prefill_s for r in results),
                       {b: statistics.median(r.decode_step_s[b] for r in results) for b in first.decode_step_s})


def speed_table(results: list[SpeedResult], baseline: str) -> list[dict]:
    """One row per variant: its times and each time's ratio to the baseline's (> 1: faster)."""
    base = next(r for r in results if r.variant == baseline)
    rows = []
    for result in results:
        row = {"variant": result.variant, "dtype": result.dtype, "prefill_ms": result.prefill_s * 1e3,
               "prefill_speedup": base.prefill_s / result.prefill_s}
        for batch, step_s in sorted(result.decode_step_s.items()):
            row[f"decode_b{batch}_ms"] = step_s * 1e3
            row[f"decode_b{batch}_speedup"] = base.decode_step_s[batch] / step_s
        rows.append(row)
    return rows


# ---- in the variant's own process ----------------------------------------------------------------
async def _measure(model: str, cores: str, dtype: str, variant: str, spin_ms: float, prompt_tokens: int,
                   batch_sizes: tuple[int, ...], context_tokens: int, steps: int, repeats: int) -> SpeedResult:
    from pdserve.engine import EngineSettings, engine_args
    from planner.profiler.engine_probe import EngineProbe
    from vllm.v1.engine.async_llm import AsyncLLM

    largest = max(batch_sizes) * (context_tokens + steps + 2)
    settings = EngineSettings(model=model, dtype="float32" if dtype == VLLM_AUTO else dtype, cpu_cores=cores,
                              max_model_len=max(prompt_tokens, context_tokens + steps) + 64,
                              max_num_seqs=max(batch_sizes), kv_cache_bytes=max(256 << 20, largest * 64 << 10),
                              enable_prefix_caching=False, preload=(), vllm_spin_ms=spin_ms)
    args = engine_args(settings, "colocated")
    if dtype == VLLM_AUTO:
        args.dtype = "auto"
    engine = AsyncLLM.from_engine_args(args)
    try:
        probe = EngineProbe(engine, int(engine.vllm_config.model_config.get_vocab_size()))
        await probe.warm_up()
        prefill_s = await probe.prefill_s(prompt_tokens, repeats)
        decode = {b: await _median_decode_step_s(probe, b, context_tokens, steps, repeats) for b in batch_sizes}
        ran = str(engine.vllm_config.model_config.dtype).removeprefix("torch.")
    finally:
        engine.shutdown()
        gc.collect()
    preloaded = ":".join(os.path.basename(path) for path in os.environ.get("LD_PRELOAD", "").split(":") if path)
    return SpeedResult(variant, ran, preloaded, prefill_s, decode)


async def _median_decode_step_s(probe, batch_size: int, context_tokens: int, steps: int, repeats: int) -> float:
    """The median of `repeats` decode measurements at one batch size (one is at the mercy of a
    neighbour's burst; decode steps are short, so a burst weighs more than on a prefill)."""
    import statistics

    samples = [(await probe.decode(batch_size, context_tokens, steps)).step_s for _ in range(repeats)]
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure one engine's prefill and decode speed (one variant of "
                                                 "bench/fast_defaults.py); writes JSON to --out.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--cores", default="", help="cores the engine is bound to, e.g. 1")
    parser.add_argument("--dtype", required=True, help=f"a dtype, or {VLLM_AUTO} for vLLM's own choice")
    parser.add_argument("--variant", default="")
    parser.add_argument("--vllm-spin-ms", type=float, default=-1.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--context-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from pdserve.cpu_placement import bind_this_process

    bind_this_process(args.cores)
    result = asyncio.run(_measure(args.model, args.cores, args.dtype, args.variant, args.vllm_spin_ms,
                                  args.prompt_tokens,
                                  tuple(int(b) for b in args.batch_sizes.split(",")), args.context_tokens,
                                  args.steps, args.repeats))
    Path(args.out).write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
