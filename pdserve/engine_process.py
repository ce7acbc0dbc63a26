"""How vLLM's engine-core process starts: the environment it must start under, and whether a
worker may fork it instead of spawning it.

On CPU vLLM spawns its engine core (`platforms/cpu.py` forces `VLLM_WORKER_MULTIPROC_METHOD=spawn`):
a fresh interpreter that imports vLLM again, 8-13 s of CPU on the 2-vCPU hosts measured (BENCHMARKS
"Forking the engine core"), at every worker start, on the cores the cluster's other workers are
using. vLLM spawns because what binds the compute threads is read once, when a library loads:
OpenMP's thread count and places when libgomp (or the preloaded Intel OpenMP) initialises, the
allocator when `LD_PRELOAD` is honoured at exec, pdserve's plugin variables when vLLM loads
plugins. A child forked from a process that did not start under those values would compute with
the wrong threads and allocator.

pdserve forks when the worker process itself started under them: `pdserve worker` re-executes
itself once, before anything imports torch, with the environment its engine needs
(`reexec_env`), and the engine then forks its engine core (`start_method`). The child inherits
the loaded vLLM, the OpenMP runtime initialised with the worker's threads and places, the
allocator, the plugin's patches (and AMX permission, which Linux keeps across fork), and the
process's core binding. Forking is vLLM's own default on GPU hosts, with AsyncLLM in a running
event loop as here; pdserve forks only where it knows the parent ran no OpenMP region (a worker,
whose API process computes nothing before its engine starts), only with the model in the engine
core ("uni": a model-runner process would need OpenMP variables of its own) and never on a GPU
host (vLLM's own choice there). Everything else spawns as before.

The decisions are pure (`engine_environment`, `start_method`, `reexec_env`); `initial_environ`
reads /proc and `reexec` replaces the process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pdserve.cpu_placement import parse_cores
from pdserve.preload import Preload
from pdserve.vllm_plugin import HOLD_WAIT_ENV, SPIN_ENV

START_METHODS = ("auto", "fork", "spawn")   # EngineSettings.engine_start

# What the engine's processes read once, at exec or library load or plugin registration, and so
# must be in a forking parent's environment from its start.
THREAD_KEYS = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
               "VLLM_ENABLE_V1_MULTIPROCESSING")
START_KEYS = (*THREAD_KEYS, "LD_PRELOAD", SPIN_ENV, HOLD_WAIT_ENV)
REEXEC_MARK = "PDSERVE_ENGINE_ENV_REEXEC"   # set in a re-executed worker: never re-execute twice


def thread_env(cpu_cores: str) -> dict[str, str]:
    """The variables that give vLLM's processes the worker's cores: vLLM binds one OpenMP compute
    thread per core of `VLLM_CPU_OMP_THREADS_BIND`, and OpenMP and MKL size their pools to the
    same count (by default they would size them to every core of the host). Empty: no binding."""
    if not cpu_cores:
        return {}
    threads = str(len(parse_cores(cpu_cores)))
    return {"VLLM_CPU_OMP_THREADS_BIND": cpu_cores, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def executor_env(executor: str, cpu_cores: str) -> dict[str, str]:
    """The variables that run a CPU engine's model in vLLM's engine-core process ("uni"), with its
    OpenMP threads bound to `cpu_cores`; {} for "mp" (vLLM's CPU default).

    On CPU vLLM runs the model in a process of its own because only there can it set OpenMP's
    binding (OMP_PLACES, OMP_PROC_BIND) before torch starts OpenMP; a worker that sets them before
    its engine core starts does the same for that process, and the model then runs in the
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


def engine_environment(environ: Mapping[str, str], *, cpu_cores: str, executor: str, spin_ms: float,
                       hold_wait_ms: float, preload: Preload | None = None) -> dict[str, str]:
    """`environ` as vLLM's engine processes must start under: one engine's thread binding replaces
    whatever another left (`THREAD_KEYS`), the model's process (`executor_env`), vLLM's spin cap
    (`spin_ms` >= 0; negative keeps vLLM's), the hold wait (`environ`'s own value wins: 0 there
    restores vLLM's loop) and `preload`'s libraries first in LD_PRELOAD (`Preload.env`)."""
    env = {key: value for key, value in environ.items() if key not in THREAD_KEYS}
    env |= thread_env(cpu_cores) | executor_env(executor, cpu_cores)
    if spin_ms >= 0:
        env[SPIN_ENV] = f"{spin_ms / 1000:g}"
    env.setdefault(HOLD_WAIT_ENV, f"{hold_wait_ms / 1000:g}")
    return preload.env(env) if preload is not None else env


def started_under(needed: Mapping[str, str], initial: Mapping[str, str]) -> bool:
    """True when a process whose environment at exec was `initial` started under what `needed`
    asks of the `START_KEYS` (a key absent from both counts as equal)."""
    return all(needed.get(key) == initial.get(key) for key in START_KEYS)


def start_method(requested: str, *, gpu: bool, executor: str, fork_safe: bool, needed: Mapping[str, str],
                 initial: Mapping[str, str]) -> str | None:
    """How the engine core starts: "fork", "spawn", or None for vLLM's own choice (GPU hosts).

    `requested` is `EngineSettings.engine_start`: "spawn" always spawns; "fork" and "auto" fork a
    CPU engine whose model runs in the engine core (`executor` "uni") from a process that ran no
    OpenMP region (`fork_safe`, the caller's word) and started under the `needed` environment
    (`initial` is its environment at exec); otherwise they spawn, "fork" too (it asks for the fork
    where it is correct, it does not force a wrong one)."""
    if requested not in START_METHODS:
        raise ValueError(f"engine start {requested!r}: one of {', '.join(START_METHODS)}")
    if gpu:
        return None
    if requested == "spawn" or executor != "uni" or not fork_safe:
        return "spawn"
    return "fork" if started_under(needed, initial) else "spawn"


def reexec_env(requested: str, *, gpu: bool, executor: str, needed: Mapping[str, str],
               initial: Mapping[str, str]) -> dict[str, str] | None:
    """The environment a worker process should re-execute itself under so that its engine core
    can be forked, or None when it need not (or must not: spawning asked for, a GPU host, a model
    runner of its own, already started under it, already re-executed once, or `initial` unknown:
    {} where /proc cannot be read, where the fork could not be decided either)."""
    if requested == "spawn" or gpu or executor != "uni" or not initial or initial.get(REEXEC_MARK):
        return None
    if started_under(needed, initial):
        return None
    return {REEXEC_MARK: "1", **needed}   # first: a variable nobody sets again (`pdserve.engine.set_environ`)


def initial_environ(pid: int | str = "self") -> dict[str, str]:
    """The environment process `pid` was executed with (/proc/PID/environ; later changes to
    os.environ do not show there). {} where /proc cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def reexec(env: Mapping[str, str]) -> None:
    """Replaces this process with the same command line under `env` (same pid: a launcher's
    handle, signals and pipes stay valid). Does not return."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], dict(env))
