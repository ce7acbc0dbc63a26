"""Engine options shared by every command that starts a vLLM engine (worker, up, bench baselines)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pdserve.preload import DEFAULT_LIBRARIES
from pdserve.engine import DEFAULT_VLLM_SPIN_MS, EXECUTORS, EngineSettings
from pdserve.engine_process import START_METHODS


def add_engine_options(parser: argparse.ArgumentParser, model_required: bool = True,
                       title: str = "engine (must match across the cluster)") -> None:
    """The engine flags every engine-starting command shares, so `engine_settings` can read them."""
    group = parser.add_argument_group(title)
    group.add_argument("--model", required=model_required,
                       help="a Hugging Face checkpoint directory (see `pdserve make-model`)")
    group.add_argument("--dtype", default="auto",
                       help="weights and KV cache dtype; auto: the faster of bfloat16 and float32 for this model "
                            "on this host, measured by a short probe of vLLM's kernels at first start and cached "
                            "per host kind in --cache-dir (bfloat16 on GPUs) (default: %(default)s)")
    group.add_argument("--cache-dir", default=None,
                       help="where measured choices are kept across runs (default: $XDG_CACHE_HOME/pdserve, "
                            "~/.cache/pdserve)")
    group.add_argument("--block-size", type=int, default=32, help="KV block size in tokens; a multiple of 32 on CPU")
    group.add_argument("--max-model-len", type=int, default=2048, help="longest prompt + output, in tokens")
    group.add_argument("--kv-cache-mb", type=int, default=256, help="KV cache memory per engine, MiB")
    group.add_argument("--max-num-seqs", type=int, default=64, help="most requests an engine batches at once")
    group.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="TOKENS",
                       help="tokens one engine step may compute (vLLM's max_num_batched_tokens: the chunk of "
                            "chunked prefill); smaller keeps the decodes beside a prompt's chunk fast (TPOT) at "
                            "the cost of more steps to its first token; `pdserve plan` may pick one "
                            "(default: vLLM's own)")
    group.add_argument("--no-prefix-caching", action="store_true", help="disable vLLM's prefix cache")
    group.add_argument("--seed", type=int, default=0, help="engine sampling seed")
    group.add_argument("--tensor-parallel-size", type=int, default=1,
                       help="GPUs each engine spans (vLLM tensor parallelism; 1 on CPU)")
    group.add_argument("--preload", default=",".join(DEFAULT_LIBRARIES),
                       help="CPU hosts: libraries preloaded into vLLM's processes where installed, comma-separated, "
                            "among tcmalloc and iomp5 (Intel OpenMP; vLLM's CPU guide recommends both; measured "
                            "on two host kinds, Intel OpenMP was never faster beyond noise) (default: %(default)s)")
    group.add_argument("--no-preload", action="store_true", help="CPU hosts: preload nothing (vLLM's own choice)")
    group.add_argument("--vllm-executor", choices=EXECUTORS, default="auto",
                       help="where vLLM runs the model: uni, in its engine-core process (CPU, one device: an "
                            "engine starts a third sooner, one process and one vLLM import less); mp, in a "
                            "model-runner process of its own (vLLM's choice on CPU); auto: uni on CPU with one "
                            "device's model, else vLLM's choice (default: auto)")
    group.add_argument("--vllm-engine-start", choices=START_METHODS, default="auto",
                       help="how a worker starts vLLM's engine-core process: auto, forked from the worker, which "
                            "re-executes itself once with the engine's thread and library environment (no second "
                            "import of vLLM: 8-13 s of CPU less per worker start on small hosts), where the model "
                            "runs in the engine core (--vllm-executor uni) on CPU, else vLLM's own way; spawn, "
                            "vLLM's own way on CPU (a fresh interpreter); fork: as auto (default: auto)")
    group.add_argument("--vllm-spin-ms", type=float, default=DEFAULT_VLLM_SPIN_MS,
                       help="how long vLLM's engine processes busy-poll each other after each message before "
                            "sleeping (vLLM's own: 1000; polling steals CPU from compute on CPU hosts, from the "
                            "OpenMP threads of a worker over several cores most); negative keeps vLLM's "
                            "(default: %(default)s)")


def engine_settings(args: argparse.Namespace, cpu_cores: str = "", probe_cores: str | None = None,
                    measure_dtype: bool = True) -> EngineSettings:
    """The engine settings the flags describe. `--dtype auto` is resolved here, once, by
    measurement (`pdserve.dtype_probe`) with the threads of `probe_cores` (default: `cpu_cores`,
    the cores one worker gets); the decision is printed to stderr. `measure_dtype=False` leaves
    `auto` to the CPU flags' guess (`EngineSettings`): for what does not depend on the dtype."""
    dtype = resolved_dtype(args, cpu_cores if probe_cores is None else probe_cores) if measure_dtype else args.dtype
    return EngineSettings(
        model=args.model, dtype=dtype, block_size=args.block_size, max_model_len=args.max_model_len,
        kv_cache_bytes=args.kv_cache_mb << 20, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size, cpu_cores=cpu_cores, vllm_spin_ms=args.vllm_spin_ms,
        executor=args.vllm_executor, engine_start=args.vllm_engine_start,
        preload=() if args.no_preload else tuple(name for name in args.preload.split(",") if name),
    )


def resolved_dtype(args: argparse.Namespace, probe_cores: str) -> str:
    """`--dtype`, with `auto` measured on this host (cached) and the decision printed."""
    if args.dtype != "auto" or not os.path.isfile(os.path.join(args.model, "config.json")):
        return args.dtype  # a model id or a missing folder: EngineSettings' guess, and vLLM's error
    from pdserve.dtype_probe import resolve_auto_dtype

    decision = resolve_auto_dtype(args.model, probe_cores, Path(args.cache_dir) if args.cache_dir else None)
    print(f"pdserve: {decision.summary()}", file=sys.stderr, flush=True)
    return decision.dtype
