"""How fast this machine's cores compute right now: one fixed matrix product timed on each core.

The I/O half of `bench/host_speed.py` (`loadgen.comparison.host_speed` is the pure half), and the
check `bench/goodput_vs_vllm.py` runs before each of its runs, so that every run carries the
machine's speed beside it: a 2-vCPU VM's speed can move by 1.5-2x within minutes with nothing
else running in it (BENCHMARKS "B* on an AMX VM whose speed swings"), which the quiet check does
not see.

- `run_phase(cores, seconds, window_s, product)`: one probe process per core, each bound to its
  core, all at once; core -> ms per product in each window;
- `speed_check_ms(cores, seconds, product=...)`: the median over every window of every core of one
  such phase (all cores busy, as a cluster runs them): one number per run, lower is faster.

Which product (`PRODUCTS`): a float32 square product through numpy's BLAS, or a prefill-shaped
bfloat16 (or float16) product through torch's CPU GEMM (oneDNN: AVX-512 BF16 or AMX tiles where the
CPU has them). Time the one the engines compute in (`product_for_dtype`): on an AMX Xeon the
bfloat16 prompts slowed 1.3x between a profile and its runs while the float32 check held within
1.05x (BENCHMARKS "B* on a steady AMX Xeon"): a check in another unit's arithmetic cannot see that.

Each probe runs one thread (OMP/BLAS threads set to 1 for the probes alone), so a core's figure is
that core's.

- `InterpreterSampler(cores)`: while a span runs (a profile, a validation rate), a fixed pure-Python
  loop timed in thread CPU time every 0.15 s on every core; its mean is how fast the cores ran
  the interpreter over the span. A small model's decode step is interpreter-bound (the engine's
  scheduling, its kernels' dispatch), and on a Zen 4 EPYC VM the loop ran 1.0x or 1.5-1.7x its
  fastest from one second to the next with the bfloat16 product unmoved. "python" among `CHECKS`
  times the same loop window by window (`bench/host_speed.py --product python`).
- `wake_check_us(cores)`: how long a message takes to go from one core to another and back between
  two processes that block on a pipe in between, each message after a short idle: the median round
  trip, microseconds. A compute check never lets a core idle, so it cannot see how slowly a VM's
  idle vCPU wakes (a busy host under it); every hop of a request (client, router, the workers' API
  processes, the engine cores) pays that wake-up. On an AVX-512 EPYC VM a profile and a validation
  run measured the served decode step 2 ms above the engine's and a request's hops 10-16 ms above
  what a quiet half hour later measured, with the bfloat16 compute check the same (BENCHMARKS, "The
  same validation on a second VM").
"""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

PRODUCT_SIZE = 384  # float32 n x n: a few ms per product on a 2020s core, inside the L2 cache
# the half-precision product: a 256-token prompt through one 768 -> 3,072 projection, the shape of a
# prefill's GEMMs (compute-bound: its speed is the matrix unit's); 1-15 ms on one core
HALF_TOKENS, HALF_IN, HALF_OUT = 256, 768, 3072
PRODUCTS = ("float32", "bfloat16", "float16")
# what `run_phase` and `bench/host_speed.py` can time: the products, and "python", the interpreter
# loop (`interpreter_cpu_ms`'s) that an engine's small steps and the serving hops run at
CHECKS = (*PRODUCTS, "python")
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_BINDING = ("OMP_PLACES", "OMP_PROC_BIND")


def product_for_dtype(dtype: str) -> str:
    """The product a speed check should time for engines computing in `dtype` (vLLM's names:
    "bfloat16", "bf16", "half", "float16", "float32", "float"...); float32 for anything else."""
    name = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32"}.get(dtype, dtype)
    return name if name in PRODUCTS else "float32"


def describe_product(product: str) -> str:
    """What `product` times, for a report: 'float32 384x384 (numpy)'."""
    _check_product(product)
    if product == "python":
        return f"a pure-Python loop of {INTERPRETER_LOOP:,} multiply-adds (the interpreter)"
    if product == "float32":
        return f"float32 {PRODUCT_SIZE}x{PRODUCT_SIZE} (numpy)"
    return f"{product} {HALF_TOKENS}x{HALF_IN} @ {HALF_IN}x{HALF_OUT} (torch)"


def _check_product(product: str) -> None:
    if product not in CHECKS:
        raise ValueError(f"unknown product {product!r}: use one of {', '.join(CHECKS)}")


def _multiply(product: str, seed: int):
    """A zero-argument call computing one `product` (its operands made and warmed up here)."""
    if product == "python":
        return interpreter_cpu_ms
    if product == "float32":
        import numpy as np

        rng = np.random.default_rng(seed)
        a, b = (rng.standard_normal((PRODUCT_SIZE, PRODUCT_SIZE), dtype=np.float32) for _ in range(2))
    else:
        import torch

        torch.set_num_threads(1)
        generator = torch.Generator().manual_seed(seed)
        a = torch.randn(HALF_TOKENS, HALF_IN, generator=generator).to(getattr(torch, product))
        b = torch.randn(HALF_IN, HALF_OUT, generator=generator).to(getattr(torch, product))
    for _ in range(5):
        a @ b
    return lambda: a @ b


def time_windows(core: int, seconds: float, window_s: float, queue, product: str = "float32") -> None:
    """On `core` alone, ms per `product` in each window of `window_s` for `seconds`: puts (core, [ms]).
    One product runs untimed first: oneDNN picks and compiles its kernel on the first call (1.6 s for
    the bfloat16 product on a Zen 4 EPYC VM), which is no measure of the core's speed."""
    os.sched_setaffinity(0, {core})
    multiply = _multiply(product, core)
    multiply()
    windows, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        started, products = time.perf_counter(), 0
        while time.perf_counter() - started < window_s:
            multiply()
            products += 1
        windows.append((time.perf_counter() - started) / products * 1e3)
    queue.put((core, windows))


@contextmanager
def _one_thread_children() -> Iterator[None]:
    """Processes started inside inherit OMP/BLAS thread counts of 1 and no OpenMP binding (each
    probe binds itself to its core; a caller's `OMP_PLACES`, such as a profiler running vLLM in
    its own process, names other cores and libgomp rejects it); this process's are restored."""
    saved = {name: os.environ.get(name) for name in (*_ONE_THREAD, *_BINDING)}
    os.environ.update({name: "1" for name in _ONE_THREAD})
    for name in _BINDING:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_phase(cores: Sequence[int], seconds: float, window_s: float,
              product: str = "float32") -> dict[int, list[float]]:
    """A probe on each of `cores` at once for `seconds`: core -> ms per `product`, window by window."""
    if seconds <= 0 or not 0 < window_s <= seconds:
        raise ValueError(f"need 0 < window_s <= seconds, got window_s={window_s}, seconds={seconds}")
    _check_product(product)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    probes = [context.Process(target=time_windows, args=(core, seconds, window_s, queue, product), daemon=True)
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


def speed_check_ms(cores: Sequence[int], seconds: float = 2.0, window_s: float = 0.5,
                   product: str = "float32") -> float:
    """Every core busy for `seconds`: the median ms per `product` over all windows (lower is faster)."""
    windows = run_phase(cores, seconds, window_s, product)
    return statistics.median(ms for per_core in windows.values() for ms in per_core)


WAKE_IDLE_S = 0.002   # between round trips: the cores go idle, as between the messages of a lightly loaded hop
WAKE_ROUNDS = 300


def _echo(core: int, conn) -> None:
    """On `core`: send back every message until b"q"."""
    os.sched_setaffinity(0, {core})
    while (message := conn.recv_bytes()) != b"q":
        conn.send_bytes(message)


def _round_trip(conn, timeout_s: float = 5.0) -> None:
    conn.send_bytes(b"x")
    if not conn.poll(timeout_s):
        raise RuntimeError(f"the wake-up probe's echo process did not answer within {timeout_s:g} s")
    conn.recv_bytes()


def wake_check_us(cores: Sequence[int], rounds: int = WAKE_ROUNDS, idle_s: float = WAKE_IDLE_S) -> float:
    """The median round trip, in microseconds, of a one-byte message from a process bound to
    `cores[0]` to one bound to `cores[-1]` (the same core when only one is given) and back, over
    `rounds` round trips `idle_s` apart. Lower is faster; ~60-80 us on a quiet 2-vCPU EPYC VM."""
    if rounds < 1 or idle_s < 0:
        raise ValueError(f"need rounds >= 1 and idle_s >= 0, got rounds={rounds}, idle_s={idle_s}")
    if not cores:
        raise ValueError("no cores to probe")
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    echo = context.Process(target=_echo, args=(cores[-1], there), daemon=True)
    echo.start()
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cores[0]})
        _round_trip(here, timeout_s=60.0)   # the echo process is up (spawned: it imports first)
        for _ in range(20):
            _round_trip(here)
        round_trips_us = []
        for _ in range(rounds):
            time.sleep(idle_s)
            started = time.perf_counter()
            _round_trip(here)
            round_trips_us.append((time.perf_counter() - started) * 1e6)
        here.send_bytes(b"q")
    finally:
        os.sched_setaffinity(0, saved)
        echo.join(timeout=5)
        if echo.is_alive():
            echo.kill()
    return statistics.median(round_trips_us)


# The interpreter check: a fixed pure-Python loop, timed in the thread's own CPU time. An engine's
# small decode steps and every hop of a request are interpreter-bound, and on a Zen 4 EPYC VM this
# loop took 1.0x or 1.5-1.7x its fastest time from one second to the next, per core, with nothing
# else running, while the half-precision product held within 1.1x (BENCHMARKS, "The decode step
# under load"). CPU time, not wall time: on a core a cluster keeps busy, the loop's waits for the
# core do not count, its speed does.
INTERPRETER_LOOP = 15_000        # multiply-adds: 0.6-1.1 ms of a Zen 4 core's CPU
INTERPRETER_PERIOD_S = 0.15      # one loop every 0.15 s: under 1.5% of each core


def interpreter_cpu_ms(loop: int = INTERPRETER_LOOP) -> float:
    """The CPU this thread spends on `loop` multiply-adds of Python ints, in ms."""
    started, total = time.thread_time(), 0
    for i in range(loop):
        total += i * i
    return (time.thread_time() - started) * 1e3


def _sample_interpreter(core: int, period_s: float, stop, ready, queue) -> None:
    """On `core`: `interpreter_cpu_ms` now (then puts `core` on `ready`) and every `period_s` after,
    until `stop` is set; puts (core, [(monotonic s, ms)]) on `queue`."""
    os.sched_setaffinity(0, {core})
    interpreter_cpu_ms()
    samples = [(time.monotonic(), interpreter_cpu_ms())]
    ready.put(core)
    while not stop.wait(period_s):
        samples.append((time.monotonic(), interpreter_cpu_ms()))
    queue.put((core, samples))


class InterpreterSampler:
    """While inside (`with InterpreterSampler(cores) as sampler:`), one process bound to each of
    `cores` times the interpreter loop every `period_s`, the first time before the span begins
    (entering waits for it, up to `START_TIMEOUT_S`); after, `samples` holds core -> [(monotonic s,
    CPU ms)], at least one each, `mean_ms` the mean over every sample (what the cores ran at on
    average over the span, lower is faster), and `entered_s` / `exited_s` the span's monotonic
    bounds (`interpreter_series` over them)."""

    START_TIMEOUT_S = 60.0   # a spawned probe imports this module first: seconds on a slow host

    def __init__(self, cores: Sequence[int], period_s: float = INTERPRETER_PERIOD_S) -> None:
        if period_s <= 0 or not cores:
            raise ValueError(f"need cores and period_s > 0, got cores={list(cores)}, period_s={period_s}")
        self.cores, self.period_s = list(cores), period_s
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self.entered_s = self.exited_s = 0.0

    def __enter__(self) -> "InterpreterSampler":
        context = multiprocessing.get_context("spawn")
        self._stop, self._queue, ready = context.Event(), context.Queue(), context.Queue()
        self._probes = [context.Process(target=_sample_interpreter,
                                        args=(core, self.period_s, self._stop, ready, self._queue), daemon=True)
                        for core in self.cores]
        for probe in self._probes:
            probe.start()
        try:
            for _ in self._probes:
                ready.get(timeout=self.START_TIMEOUT_S)
        except BaseException:
            self._stop.set()
            self._end_probes()
            raise
        self.entered_s = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.exited_s = time.monotonic()
        self._stop.set()
        try:
            for _ in self._probes:
                core, samples = self._queue.get(timeout=60)
                self.samples[core] = samples
        finally:
            self._end_probes()

    def _end_probes(self) -> None:
        for probe in self._probes:
            probe.join(timeout=5)
            if probe.is_alive():
                probe.kill()

    @property
    def mean_ms(self) -> float:
        return mean_interpreter_ms(self.samples)


def mean_interpreter_ms(samples: dict[int, list[tuple[float, float]]]) -> float:
    """The mean CPU ms of every sample of every core (`InterpreterSampler.samples`); 0.0 with none."""
    values = [ms for per_core in samples.values() for _, ms in per_core]
    return statistics.fmean(values) if values else 0.0


INTERPRETER_WINDOW_S = 1.0   # the series' window: lone decode steps followed the loop 1:1 over whole seconds (Zen 4)


def interpreter_series(samples: dict[int, list[tuple[float, float]]], start_s: float, end_s: float,
                       window_s: float = INTERPRETER_WINDOW_S) -> dict[int, list[float | None]]:
    """Each core's interpreter speed second by second over [start_s, end_s) (monotonic s, the
    clock of `InterpreterSampler.samples` and of `time.perf_counter`): the mean CPU ms of the
    samples in each `window_s` window from `start_s`, None for a window without one. What lets a
    simulator replay the machine's speed as it moved, not only its mean (`RateRun.machine`)."""
    if window_s <= 0 or end_s < start_s:
        raise ValueError(f"need window_s > 0 and end_s >= start_s, got {window_s}, [{start_s}, {end_s})")
    windows = max(1, math.ceil((end_s - start_s) / window_s))
    series = {}
    for core, per_core in samples.items():
        buckets: list[list[float]] = [[] for _ in range(windows)]
        for at_s, ms in per_core:
            if start_s <= at_s < end_s:
                buckets[min(int((at_s - start_s) / window_s), windows - 1)].append(ms)
        series[core] = [round(statistics.fmean(b), 4) if b else None for b in buckets]
    return series


def series_spread(series: Iterable[Sequence[float | None]]) -> tuple[float, float] | None:
    """The 10th and 90th percentiles of every window of every core's series (`interpreter_series`'
    values; windows without a sample left out): how far the speed moved; None under 2 windows."""
    windows = [ms for per_core in series for ms in per_core if ms is not None]
    if len(windows) < 2:
        return None
    deciles = statistics.quantiles(windows, n=10, method="inclusive")
    return deciles[0], deciles[-1]
