"""How fast this machine's cores compute right now: one fixed matrix product timed on each core.

The I/O half of `bench/host_speed.py` (`loadgen.comparison.host_speed` is the pure half), and the
check `bench/goodput_vs_vllm.py` runs before each of its runs, so that every run carries the
machine's speed beside it: a 2-vCPU VM's speed can move by 1.5-2x within minutes with nothing
else running in it (BENCHMARKS "B* on an AMX VM whose speed swings"), which the quiet check does
not see.

- `run_phase(cores, seconds, window_s)`: one probe process per core, each bound to its core, all
  at once; core -> ms per product in each window;
- `speed_check_ms(cores, seconds)`: the median over every window of every core of one such phase
  (all cores busy, as a cluster runs them): one number per run, lower is faster.

Each probe runs one thread (OMP/BLAS threads set to 1 for the probes alone), so a core's figure is
that core's.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

PRODUCT_SIZE = 384  # float32 n x n: a few ms per product on a 2020s core, inside the L2 cache
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def time_windows(core: int, seconds: float, window_s: float, queue) -> None:
    """On `core` alone, ms per product in each window of `window_s` for `seconds`: puts (core, [ms])."""
    import numpy as np

    os.sched_setaffinity(0, {core})
    rng = np.random.default_rng(core)
    a, b = (rng.standard_normal((PRODUCT_SIZE, PRODUCT_SIZE), dtype=np.float32) for _ in range(2))
    for _ in range(5):
        a @ b
    windows, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        started, products = time.perf_counter(), 0
        while time.perf_counter() - started < window_s:
            a @ b
            products += 1
        windows.append((time.perf_counter() - started) / products * 1e3)
    queue.put((core, windows))


@contextmanager
def _one_thread_children() -> Iterator[None]:
    """Processes started inside inherit OMP/BLAS thread counts of 1; this process's are restored."""
    saved = {name: os.environ.get(name) for name in _ONE_THREAD}
    os.environ.update({name: "1" for name in _ONE_THREAD})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_phase(cores: Sequence[int], seconds: float, window_s: float) -> dict[int, list[float]]:
    """A probe on each of `cores` at once for `seconds`: core -> ms per product, window by window."""
    if seconds <= 0 or not 0 < window_s <= seconds:
        raise ValueError(f"need 0 < window_s <= seconds, got window_s={window_s}, seconds={seconds}")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    probes = [context.Process(target=time_windows, args=(core, seconds, window_s, queue), daemon=True)
              for core in cores]
    with _one_thread_children():
        for probe in probes:
            probe.start()
    try:
        results = dict(queue.get(timeout=seconds + 60) for _ in probes)
    finally:
        for probe in probes:
            probe.join(timeout=5)
            if probe.is_alive():
                probe.kill()
    return results


def speed_check_ms(cores: Sequence[int], seconds: float = 2.0, window_s: float = 0.5) -> float:
    """Every core busy for `seconds`: the median ms per product over all windows (lower is faster)."""
    windows = run_phase(cores, seconds, window_s)
    return statistics.median(ms for per_core in windows.values() for ms in per_core)
