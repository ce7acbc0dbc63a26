"""An opt-in trace of a vLLM engine core's steps: when each started and ended, and what it ran.

What a client sees as one decode gap is an engine step and everything around it: the engine core's
own work between steps (taking in requests, sending outputs), the worker's API process, the router,
the client. The planner charges the engine's part from the profile's idle runs; under load the
client's gap sits above them (BENCHMARKS "Across shapes on a second AMX kind"), and this trace
tells which part grew. `PDSERVE_VLLM_STEP_TRACE_DIR` set in a worker's environment (inherited by
`pdserve up`'s workers and their engine cores) makes pdserve's vLLM plugin (`pdserve.vllm_plugin`)
wrap the engine core's step: each step that scheduled work appends one line to
`DIR/steps-<engine id>-<pid>.csv` (`STEP_COLUMNS`). Times are `time.monotonic()` seconds, the
clock Python's `perf_counter` reads on Linux, so a client on the same host lines its token times
up with the steps.

The cost is a clock read and a buffered line a step (flushed every `FLUSH_S` and whenever the
engine runs out of work); unset, nothing is wrapped. `StepShape.of` (what a step ran),
`read_steps` (the file back) and `trace_files` are pure.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from dataclasses import astuple, dataclass, fields
from pathlib import Path

STEP_TRACE_ENV = "PDSERVE_VLLM_STEP_TRACE_DIR"
FLUSH_S = 0.5

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepShape:
    """What one engine step ran: requests new to the batch (`joined`: their first step here, a
    prompt computed or, on a decode worker, its pulled KV's last token), requests continuing,
    the tokens scheduled, how many requests computed one token (decode), and the context their
    attention read (tokens computed before the step plus the step's own, over every request)."""

    joined: int
    continuing: int
    tokens: int
    decoding: int
    context_tokens: int

    @staticmethod
    def of(scheduler_output) -> StepShape:
        """From a vLLM `SchedulerOutput` (read by attribute: any object with its fields)."""
        scheduled = scheduler_output.num_scheduled_tokens
        new = scheduler_output.scheduled_new_reqs
        cached = scheduler_output.scheduled_cached_reqs
        context = sum(r.num_computed_tokens for r in new) + sum(cached.num_computed_tokens)
        return StepShape(joined=len(new), continuing=len(cached.req_ids),
                         tokens=scheduler_output.total_num_scheduled_tokens,
                         decoding=sum(1 for n in scheduled.values() if n == 1),
                         context_tokens=context + scheduler_output.total_num_scheduled_tokens)


@dataclass(frozen=True)
class TracedStep:
    """One line of a trace: the step's start and end (monotonic seconds) and its shape."""

    start_s: float
    end_s: float
    joined: int
    continuing: int
    tokens: int
    decoding: int
    context_tokens: int

    @property
    def batch(self) -> int:
        return self.joined + self.continuing

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def only_decodes(self) -> bool:
        """Every request it scheduled computed one token (a decode worker's step, joins included:
        a pulled prompt's join computes its last token)."""
        return self.tokens == self.decoding > 0


STEP_COLUMNS = tuple(f.name for f in fields(TracedStep))


def read_steps(path: str | Path) -> list[TracedStep]:
    """A trace file's steps in the order they ran; a last line cut short (the process stopped
    mid-write) is skipped."""
    steps = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return []
        if tuple(header) != STEP_COLUMNS:
            raise ValueError(f"{path}: not a step trace (columns {header}, expected {list(STEP_COLUMNS)})")
        for row in reader:
            if len(row) != len(STEP_COLUMNS):
                continue
            try:
                steps.append(TracedStep(float(row[0]), float(row[1]), *(int(v) for v in row[2:])))
            except ValueError:
                continue
    return steps


def trace_files(directory: str | Path, engine_id: str) -> list[Path]:
    """The trace files `engine_id`'s engine cores wrote in `directory` (one per process), not
    another engine's whose id starts alike (decode-1 is not decode-10)."""
    prefix = f"steps-{engine_id}-"
    return sorted(path for path in Path(directory).glob(f"{prefix}*.csv") if path.stem[len(prefix):].isdigit())


class StepWriter:
    """Appends one engine core's steps to its file, flushing at most every `FLUSH_S`."""

    def __init__(self, directory: str | Path, engine_id: str):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"steps-{engine_id}-{os.getpid()}.csv"
        self._file = open(self.path, "w", newline="", buffering=1 << 16)
        self._csv = csv.writer(self._file)
        self._csv.writerow(STEP_COLUMNS)
        self._flushed_s = time.monotonic()

    def write(self, start_s: float, end_s: float, shape: StepShape, idle: bool) -> None:
        """`idle`: the engine has nothing left to run (the file is flushed then too, so a reader
        between requests sees every step)."""
        self._csv.writerow((f"{start_s:.6f}", f"{end_s:.6f}", *astuple(shape)))
        if idle or end_s - self._flushed_s >= FLUSH_S:
            self._file.flush()
            self._flushed_s = end_s


def install(directory: str) -> None:
    """Wraps vLLM's `EngineCore.step` and `step_with_batch_queue` (and its scheduler's `schedule`,
    for the shape) so every step that scheduled work is written to `directory`."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore, "_pdserve_step_trace", False):
        return
    original_schedule = Scheduler.schedule
    shapes: list[StepShape] = []   # the shapes scheduled and not yet written (a batch queue holds several)
    writers: dict[int, StepWriter] = {}

    def schedule(self, *args, **kwargs):
        output = original_schedule(self, *args, **kwargs)
        if output.total_num_scheduled_tokens > 0:
            shapes.append(StepShape.of(output))
        return output

    def traced(original, batch_queue: bool):
        # a plain step schedules and runs one batch; a batch-queue step may schedule one and run an
        # earlier one: its line is the oldest batch scheduled, written when a model run finished
        def step(self):
            start_s = time.monotonic()
            scheduled = len(shapes)
            result = original(self)
            ran = bool(result[1]) if batch_queue else len(shapes) > scheduled
            if ran and shapes:
                writer = writers.get(id(self))
                if writer is None:
                    writer = writers[id(self)] = StepWriter(directory, _engine_id(self))
                writer.write(start_s, time.monotonic(), shapes.pop(0), idle=not self.scheduler.has_unfinished_requests())
            return result
        return step

    Scheduler.schedule = schedule
    EngineCore.step = traced(EngineCore.step, batch_queue=False)
    EngineCore.step_with_batch_queue = traced(EngineCore.step_with_batch_queue, batch_queue=True)
    EngineCore._pdserve_step_trace = True
    logger.info("vLLM engine core steps are traced to %s", directory)


def _engine_id(engine_core) -> str:
    config = getattr(getattr(engine_core, "vllm_config", None), "kv_transfer_config", None)
    return str(getattr(config, "engine_id", None) or "engine")
