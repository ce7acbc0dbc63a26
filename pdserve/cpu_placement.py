"""Where a worker's processes run on a CPU host: core lists, and binding a process tree to them.

A vLLM worker on a CPU host is three processes (the API process with pdserve's gRPC server, the
engine core, the model runner) and the model runner's compute threads. vLLM binds only the compute
threads (`VLLM_CPU_OMP_THREADS_BIND`); the other two float over every core, so on a small host a
prefill worker's engine core polls on the decode worker's core and the other way round. Binding
the worker's own process before the engine starts puts all of them, and whatever they spawn, on
the worker's cores.
"""

from __future__ import annotations

import os


def parse_cores(spec: str) -> frozenset[int]:
    """The cores of a list like "0", "0-3" or "0,2,4-5"; raises ValueError naming the bad part."""
    cores: set[int] = set()
    for part in spec.split(","):
        low, dash, high = (piece.strip() for piece in part.partition("-"))
        if not low.isdigit() or (dash and not high.isdigit()) or (high and int(high) < int(low)):
            raise ValueError(f"cpu cores {spec!r}: {part!r} is not a core or a range like 0, 0-3 or 0,2")
        cores.update(range(int(low), int(high or low) + 1))
    return frozenset(cores)


def bind_this_process(spec: str) -> frozenset[int]:
    """Binds the calling process, every thread it already runs, and every thread and process it
    starts later to the cores of `spec`. (Linux binds threads, not processes: `sched_setaffinity`
    of pid 0 moves the calling thread alone, so a thread an import started earlier, gRPC's or a
    thread pool's, would go on polling on every core.)

    Returns the cores bound; "" binds nothing and returns the current affinity."""
    if not spec:
        return frozenset(os.sched_getaffinity(0))
    cores = parse_cores(spec)
    os.sched_setaffinity(0, cores)
    for thread_id in _thread_ids():
        try:
            os.sched_setaffinity(thread_id, cores)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
    return cores


def _thread_ids() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except FileNotFoundError:  # no /proc (not Linux): the calling thread is all that was bound
        return []
