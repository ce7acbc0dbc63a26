"""Builds the vLLM engine inside a worker, for one of three roles.

- prefill: KV producer; its connector serves the prompt's blocks to decode workers.
- decode: KV consumer; loads remote prompts, and can also run a short prompt alone.
- colocated: no connector; vLLM as it is (the baseline and the reference for correctness).

Everything that must match across the cluster for KV bytes to be interchangeable (dtype, block
size) comes from one `EngineSettings`; the connector re-checks it at every handshake. Its dtype
"auto" is resolved once, where the settings are made (`native_dtype`), and travels as a concrete
name to every worker a launcher starts, so one cluster never mixes dtypes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal

from kv_transfer.config import CONNECTOR_MODULE, CONNECTOR_NAME, ConnectorConfig
from pdserve.cpu_placement import parse_cores
from pdserve.preload import DEFAULT_LIBRARIES, Preload, check_libraries, find_preload, torch_libgomp, with_openmp
from pdserve.engine_process import START_METHODS, engine_environment, initial_environ, start_method

from pdserve.roles import Role

EngineRole = Literal[Role, "colocated"]   # a worker's engine, or vLLM serving both phases
logger = logging.getLogger(__name__)
_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}


def native_dtype(cpuinfo: str | None = None) -> str:
    """The dtype this host computes natively: "bfloat16" on a GPU and on CPUs with bf16 arithmetic
    (x86 AVX512-BF16 or AMX, Arm BF16), "float32" on other CPUs. On an AVX2-only x86 CPU PyTorch
    emulates bf16 matmuls at 13-67x the time of float32 ones (measured on a 2-core AMD EPYC with the
    `tiny` and `bench` models' shapes), so a bf16 engine there serves a fraction of what it could.
    `cpuinfo` is /proc/cpuinfo's text (read when None); where neither is known, vLLM's bfloat16."""
    if on_gpu():
        return "bfloat16"
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return "bfloat16"
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return "bfloat16"
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16", "bf16"} else "float32"


# vLLM's busy-poll cap, ms. Measured under load on a 2-core host (BENCHMARKS "Where the unbound
# processes run, and how long vLLM spins"): against 50 ms, 5 ms cut a one-core decode worker's
# TPOT 9.6 -> 7.4 ms and a worker over both cores' TTFT p90 4.0 s -> 0.3 s (its OpenMP threads wait
# on a core the poller holds). 0 is not safe: a reader may then sleep through a notification.
DEFAULT_VLLM_SPIN_MS = 5.0

# How long vLLM's engine core waits for a request between the empty steps it runs while it only
# holds finished requests' blocks for a KV pull (pdserve.vllm_plugin, "Holding"); vLLM's own: 1 ms.
# The environment's PDSERVE_VLLM_HOLD_WAIT_S, where set, wins (0: vLLM's own loop).
DEFAULT_HOLD_WAIT_MS = 50.0


@dataclass(frozen=True)
class EngineSettings:
    model: str
    dtype: str = "auto"  # "auto": `native_dtype()`, resolved when the settings are made
    block_size: int = 32
    max_model_len: int = 2048
    kv_cache_bytes: int = 256 << 20
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    tensor_parallel_size: int = 1  # GPUs one engine spans (vLLM starts one process per GPU); 1 on CPU
    cpu_cores: str = ""   # CPU hosts: cores the engine's threads are bound to, e.g. "0" or "0-1"; "" = vLLM's choice
    # How long vLLM's engine-core and model-runner processes busy-poll each other after a message
    # before sleeping on a socket (vLLM: 1 s). On CPU hosts that poll competes with the compute
    # threads; see pdserve.vllm_plugin and DEFAULT_VLLM_SPIN_MS. Negative: leave vLLM's own value.
    vllm_spin_ms: float = DEFAULT_VLLM_SPIN_MS
    # CPU hosts: the libraries of pdserve.preload.LIBRARIES preloaded into vLLM's engine processes
    # where installed (default: the measured choice, tcmalloc; see pdserve.preload). (): vLLM's own.
    preload: tuple[str, ...] = DEFAULT_LIBRARIES
    # Where the model runs: "uni", in vLLM's engine-core process (CPU, one device: one process and one
    # vLLM import less, up a third sooner); "mp", in a model-runner process of its own (vLLM's choice
    # on CPU); "auto": uni on a CPU host with one device's model, else vLLM's choice (`resolved_executor`).
    executor: str = "auto"
    # How vLLM's engine core starts: "auto" forks it from a worker started under the engine's
    # environment (no second import of vLLM; `pdserve.engine_process`), else spawns it as vLLM does
    # on CPU; "spawn" always spawns; "fork" is "auto" said explicitly. GPU hosts: vLLM's choice.
    engine_start: str = "auto"

    def __post_init__(self) -> None:
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", native_dtype())
        if self.block_size <= 0 or self.block_size % 32:
            raise ValueError(f"block_size {self.block_size}: vLLM's CPU backend needs a positive multiple of 32")
        if self.kv_cache_bytes < (1 << 20):
            raise ValueError(f"kv_cache_bytes {self.kv_cache_bytes} is too small for any KV block")
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens {self.max_num_batched_tokens}: vLLM needs at least max_num_seqs "
                             f"({self.max_num_seqs}) tokens per step")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size}: must be at least 1")
        if self.cpu_cores:
            parse_cores(self.cpu_cores)  # raises with the bad part named
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor {self.executor!r}: one of {', '.join(EXECUTORS)}")
        if self.executor == "uni" and self.tensor_parallel_size > 1:
            raise ValueError(f"executor uni runs one device's model; tensor_parallel_size is {self.tensor_parallel_size}")
        if self.engine_start not in START_METHODS:
            raise ValueError(f"engine_start {self.engine_start!r}: one of {', '.join(START_METHODS)}")
        object.__setattr__(self, "preload", check_libraries(tuple(self.preload)))

    def to_dict(self) -> dict:
        return asdict(self)


def on_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() not in ("", "-1")


def find_engine_preload(settings: EngineSettings, gpu: bool) -> Preload | None:
    """The libraries of `settings.preload` found on this CPU host, and PyTorch's OpenMP runtime as
    vLLM's CPU platform adds it (`pdserve.preload.with_openmp`); None on a GPU host or with none
    asked for (vLLM's own choice). Logs what will be preloaded and what is skipped."""
    if not settings.preload or gpu:
        return None
    preload = with_openmp(find_preload(names=settings.preload), os.environ.get("LD_PRELOAD", ""), torch_libgomp())
    (logger.warning if preload.missing else logger.info)("%s", preload.summary())
    return preload


EXECUTORS = ("auto", "uni", "mp")


def resolved_executor(settings: EngineSettings, gpu: bool) -> str:
    """"uni" or "mp" for `settings` (`EngineSettings.executor`) on a host with (`gpu`) or without GPUs.
    "auto" is "uni" on CPU with one device's model (`pdserve.engine_process.executor_env` says why)
    and "mp" otherwise, which stands for vLLM's own choice (on a GPU, vLLM runs one device's model in
    its engine core anyway). An explicit "uni" on a GPU host is vLLM's to take or refuse."""
    if settings.executor == "auto":
        return "uni" if not gpu and settings.tensor_parallel_size == 1 else "mp"
    return settings.executor


def engine_process_env(settings: EngineSettings, environ: dict[str, str], gpu: bool,
                       preload: Preload | None = None) -> dict[str, str]:
    """`environ` as the processes of an engine with `settings` must start under
    (`pdserve.engine_process.engine_environment`); `preload`: `find_engine_preload`'s answer."""
    return engine_environment(environ, cpu_cores=settings.cpu_cores, executor=resolved_executor(settings, gpu),
                              spin_ms=settings.vllm_spin_ms, hold_wait_ms=DEFAULT_HOLD_WAIT_MS, preload=preload)


def engine_start_env(settings: EngineSettings, environ: Mapping[str, str], gpu: bool | None = None) -> dict[str, str]:
    """`engine_process_env` with the preloads this host has for `settings` (`find_engine_preload`):
    what an engine's processes start under, and what a process that forks its engine core (a worker,
    a co-run side, a test's reference engine) must itself have been executed under. `gpu` defaults
    to `on_gpu()`."""
    gpu = on_gpu() if gpu is None else gpu
    return engine_process_env(settings, dict(environ), gpu, find_engine_preload(settings, gpu))


def set_environ(env: dict[str, str]) -> None:
    """Makes os.environ equal `env`, touching only the keys that differ: a variable set again, even to
    its own value, moves out of the block the process was executed with, where a forked engine core's
    `setproctitle` looks for the command line it retitles (`VLLM::EngineCore`)."""
    for key in [key for key in os.environ if key not in env]:
        del os.environ[key]
    os.environ.update({key: value for key, value in env.items() if os.environ.get(key) != value})


def engine_args(settings: EngineSettings, role: EngineRole, connector: ConnectorConfig | None = None,
                engine_id: str = ""):
    """vLLM `AsyncEngineArgs` for `role`; prefill and decode need a `connector` config."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    gpu = on_gpu()
    executor = resolved_executor(settings, gpu)
    # One engine's binding must not leak into the next one started here; the engine's processes
    # inherit the rest (pdserve.engine_process: what they read, and when).
    set_environ(engine_start_env(settings, os.environ, gpu))
    kv_transfer_config = None
    if role != "colocated":
        if connector is None:
            raise ValueError(f"a {role} engine needs a KV connector config")
        if settings.tensor_parallel_size > 1:
            # Each tensor-parallel rank holds a shard of the KV heads; the connector moves one
            # rank's cache. Refuse rather than hand a decode engine half a KV cache.
            raise ValueError(f"tensor_parallel_size {settings.tensor_parallel_size}: pdserve's KV connector "
                             "moves one rank's KV cache, so prefill and decode workers run with 1 GPU each "
                             "for now (a colocated engine may span several)")
        kv_transfer_config = KVTransferConfig(
            kv_connector=CONNECTOR_NAME,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role=_KV_ROLES[role],
            engine_id=engine_id or None,
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=asdict(connector),
        )
    return AsyncEngineArgs(
        model=settings.model,
        dtype=settings.dtype,
        block_size=settings.block_size,
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=settings.kv_cache_bytes,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=settings.enable_prefix_caching,
        enforce_eager=True,
        seed=settings.seed,
        tensor_parallel_size=settings.tensor_parallel_size,
        kv_transfer_config=kv_transfer_config,
        disable_log_stats=True,
        distributed_executor_backend="uni" if executor == "uni" else None,
    )


def start_engine(settings: EngineSettings, role: EngineRole, connector: ConnectorConfig | None = None,
                 engine_id: str = "", stat_loggers: list | None = None, fork_safe: bool = False):
    """An `AsyncLLM`; call from inside a running event loop, in a `__main__`-guarded process.

    `fork_safe`: the caller's word that this process has run no OpenMP region (a worker's API
    process); with it, and a process started under the engine's environment, vLLM's engine core is
    forked from this process instead of spawned (`pdserve.engine_process.start_method`)."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = engine_args(settings, role, connector, engine_id)
    gpu = on_gpu()
    # vLLM's CPU platform asks for spawn here and may add to LD_PRELOAD what its spawned processes
    # would load: the decision compares the environment after it with the one this process started under.
    config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
    multimodal = getattr(config.model_config, "multimodal_config", None) is not None   # vLLM checks its IPC for spawn
    method = start_method(settings.engine_start, gpu=gpu, executor=resolved_executor(settings, gpu),
                          fork_safe=fork_safe and not multimodal, needed=dict(os.environ), initial=initial_environ())
    if method is not None:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = method
    logger.info("vLLM's engine core starts by %s", method or "vLLM's choice of start method")
    return AsyncLLM.from_vllm_config(config, stat_loggers=stat_loggers, disable_log_stats=args.disable_log_stats)


def tokens_prompt(prompt_token_ids, cache_salt: str = ""):
    """vLLM's prompt for these token ids; `cache_salt` (non-empty) salts its prefix cache, so the
    request shares cached blocks only with requests of the same salt (vLLM folds the salt into
    the first block's hash)."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
    if cache_salt:
        prompt["cache_salt"] = cache_salt
    return prompt
