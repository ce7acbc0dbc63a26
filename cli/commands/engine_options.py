"""Engine options shared by every command that starts a vLLM engine (worker, up, bench baselines)."""

from __future__ import annotations

import argparse

from pdserve.engine import EngineSettings


def add_engine_options(parser: argparse.ArgumentParser, model_required: bool = True,
                       title: str = "engine (must match across the cluster)") -> None:
    """The engine flags every engine-starting command shares, so `engine_settings` can read them."""
    group = parser.add_argument_group(title)
    group.add_argument("--model", required=model_required,
                       help="a Hugging Face checkpoint directory (see `pdserve make-model`)")
    group.add_argument("--dtype", default="auto",
                       help="weights and KV cache dtype; auto: bfloat16 on GPUs and on CPUs with bf16 arithmetic "
                            "(AVX512-BF16, AMX, Arm BF16), float32 on other CPUs, where bf16 is emulated at many "
                            "times the cost (default: %(default)s)")
    group.add_argument("--block-size", type=int, default=32, help="KV block size in tokens; a multiple of 32 on CPU")
    group.add_argument("--max-model-len", type=int, default=2048, help="longest prompt + output, in tokens")
    group.add_argument("--kv-cache-mb", type=int, default=256, help="KV cache memory per engine, MiB")
    group.add_argument("--max-num-seqs", type=int, default=64, help="most requests an engine batches at once")
    group.add_argument("--no-prefix-caching", action="store_true", help="disable vLLM's prefix cache")
    group.add_argument("--seed", type=int, default=0, help="engine sampling seed")
    group.add_argument("--tensor-parallel-size", type=int, default=1,
                       help="GPUs each engine spans (vLLM tensor parallelism; 1 on CPU)")
    group.add_argument("--vllm-spin-ms", type=float, default=50.0,
                       help="how long vLLM's engine processes busy-poll each other after each message before "
                            "sleeping (vLLM's own: 1000; polling steals CPU from compute on CPU hosts); "
                            "negative keeps vLLM's (default: %(default)s)")


def engine_settings(args: argparse.Namespace, cpu_cores: str = "") -> EngineSettings:
    return EngineSettings(
        model=args.model, dtype=args.dtype, block_size=args.block_size, max_model_len=args.max_model_len,
        kv_cache_bytes=args.kv_cache_mb << 20, max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=not args.no_prefix_caching, seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size, cpu_cores=cpu_cores, vllm_spin_ms=args.vllm_spin_ms,
    )

