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
from dataclasses import asdict, dataclass
from typing import Literal

from kv_transfer.config import CONNECTOR_MODULE, CONNECTOR_NAME, ConnectorConfig
from pdserve.cpu_placement import parse_cores
from pdserve.preload import DEFAULT_LIBRARIES, Preload, check_libraries, find_preload
from pdserve.vllm_plugin import HOLD_WAIT_ENV, SPIN_ENV

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
        object.__setattr__(self, "preload", check_libraries(tuple(self.preload)))

    def to_dict(self) -> dict:
        return asdict(self)


def on_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() not in ("", "-1")


def preload_into_engine_processes(names: tuple[str, ...]) -> Preload:
    """Puts the libraries `names` (where installed) into LD_PRELOAD, which the engine core and the
    model runner vLLM spawns next inherit; logs what was preloaded and what was skipped."""
    preload = find_preload(names=names)
    os.environ.update(preload.env(dict(os.environ)))
    (logger.warning if preload.missing else logger.info)("%s", preload.summary())
    return preload


THREAD_KEYS = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
               "VLLM_ENABLE_V1_MULTIPROCESSING")
EXECUTORS = ("auto", "uni", "mp")


def thread_env(cpu_cores: str) -> dict[str, str]:
    """The variables that give vLLM's processes the worker's cores: vLLM binds one OpenMP compute
    thread per core of `VLLM_CPU_OMP_THREADS_BIND`, and OpenMP and MKL size their pools to the
    same count (by default they would size them to every core of the host). Empty: no binding."""
    if not cpu_cores:
        return {}
    threads = str(len(parse_cores(cpu_cores)))
    return {"VLLM_CPU_OMP_THREADS_BIND": cpu_cores, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def resolved_executor(settings: EngineSettings, gpu: bool) -> str:
    """"uni" or "mp" for `settings` (`EngineSettings.executor`) on a host with (`gpu`) or without GPUs.
    "auto" is "uni" on CPU with one device's model (`executor_env` says why) and "mp" otherwise,
    which stands for vLLM's own choice (on a GPU, vLLM runs one device's model in its engine core
    anyway). An explicit "uni" on a GPU host is vLLM's to take or refuse."""
    if settings.executor == "auto":
        return "uni" if not gpu and settings.tensor_parallel_size == 1 else "mp"
    return settings.executor


def executor_env(executor: str, cpu_cores: str) -> dict[str, str]:
    """The variables that run a CPU engine's model in vLLM's engine-core process ("uni"), with its
    OpenMP threads bound to `cpu_cores`; {} for "mp" (vLLM's CPU default).

    On CPU vLLM runs the model in a process of its own because only there can it set OpenMP's
    binding (OMP_PLACES, OMP_PROC_BIND) before torch starts OpenMP; a worker that sets them before
    vLLM spawns its engine core does the same for that process, and the model then runs in the
    engine core with no model-runner process, no message queue polled between the two, and one
    import of vLLM less at every start. Measured on a 2-vCPU Xeon (bench model, one core, two runs
    of each): the engine up in 16 s against 23-25 s, the same prefill and decode step times
    (within 1-4%), the same greedy tokens. VLLM_ENABLE_V1_MULTIPROCESSING=0 is what keeps vLLM's
    CPU platform from forcing its multiprocess executor; AsyncLLM still runs the engine core in a
    process of its own. A streamed answer may then carry two tokens in one event more often (vLLM's
    output collector merges the deltas of steps the API process has not sent yet, as vLLM's own
    server does when it falls behind); the compatibility suite reads a stream as the tokens it
    carries however they were cut (tests/openai_compat.py `coalesced`)."""
    if executor != "uni":
        return {}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if cpu_cores:
        cores = ",".join(str(core) for core in sorted(parse_cores(cpu_cores)))
        env |= {"OMP_PLACES": "{" + cores + "}", "OMP_PROC_BIND": "true"}   # as vLLM sets them for its model runner
    return env


def engine_args(settings: EngineSettings, role: EngineRole, connector: ConnectorConfig | None = None,
                engine_id: str = ""):
    """vLLM `AsyncEngineArgs` for `role`; prefill and decode need a `connector` config."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    for key in THREAD_KEYS:  # one engine's binding must not leak into the next one started here
        os.environ.pop(key, None)
    os.environ.update(thread_env(settings.cpu_cores))
    executor = resolved_executor(settings, on_gpu())
    os.environ.update(executor_env(executor, settings.cpu_cores))
    if settings.vllm_spin_ms >= 0:  # read by pdserve.vllm_plugin in the engine's child processes
        os.environ[SPIN_ENV] = f"{settings.vllm_spin_ms / 1000:g}"
    os.environ.setdefault(HOLD_WAIT_ENV, f"{DEFAULT_HOLD_WAIT_MS / 1000:g}")
    if settings.preload and not on_gpu():
        preload_into_engine_processes(settings.preload)
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
                 engine_id: str = ""):
    """An `AsyncLLM`; call from inside a running event loop, in a `__main__`-guarded process."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(engine_args(settings, role, connector, engine_id))


def tokens_prompt(prompt_token_ids, cache_salt: str = ""):
    """vLLM's prompt for these token ids; `cache_salt` (non-empty) salts its prefix cache, so the
    request shares cached blocks only with requests of the same salt (vLLM folds the salt into
    the first block's hash)."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
    if cache_salt:
        prompt["cache_salt"] = cache_salt
    return prompt
