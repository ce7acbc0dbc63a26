"""An opt-in trace of a vLLM engine core's steps: when each started and ended, and what it ran.

What a client sees as one decode gap is an engine step and everything around it: the engine core's
own work between steps (taking in requests, sending outputs), the worker's API process, the router,
the client. The planner charges the engine's part from the profile's idle runs; under load the
client's gap sits above them (BENCHMARKS "Across shapes on a second AMX kind"), and this trace
tells which part grew. `PDSERVE_VLLM_STEP_TRACE_DIR` set in a worker's environment (inherited by
`pdserve up`'s workers and their engine cores) makes pdserve's vLLM plugin (`pdserve.vllm_plugin`)
wrap the engine core's step: each step that scheduled work appends one line to
`DIR/steps-<engine id>-<pid>.csv` (`STEP_COLUMNS`), and each request's first step one line to
`DIR/joins-<engine id>-<pid>.csv` (`JOIN_COLUMNS`): when the worker's front end accepted it, when
the engine core's scheduler took it in, when its KV pull was reported done (a decode worker's), and
the step it first ran in. Times are `time.monotonic()` seconds, the clock Python's `perf_counter`
reads on Linux, so a client on the same host lines its token times up with the steps; the front
end's stamp (vLLM's `arrival_time`, wall-clock) is moved onto that clock by their offset at install.

The cost is a clock read and a buffered line a step (flushed every `FLUSH_S` and whenever the
engine runs out of work); unset, nothing is wrapped. `StepShape.of` (what a step ran),
`read_steps` / `read_joins` (the files back), `trace_files` and `engine_steps` / `engine_joins`
(an engine's over its processes) only read.
"""

from __future__ import annotations

import csv
import logging
import math
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


@dataclass(frozen=True)
class TracedJoin:
    """One request's way into an engine's batch, in monotonic seconds: `accepted_s` when the
    worker's front end took it (vLLM's `arrival_time`), `arrived_s` when the engine core's
    scheduler took it in (between two steps), `pulled_s` when its KV pull was reported done (after
    the step whose connector finished it; NaN: it pulled nothing, its prompt is computed here), and
    the first step that ran it (`start_s`, `end_s`: a prompt's first chunk, or a pulled prompt's
    last token and so its first decode token)."""

    request_id: str
    prompt_tokens: int
    accepted_s: float
    arrived_s: float
    pulled_s: float
    start_s: float
    end_s: float

    @property
    def pulled(self) -> bool:
        return not math.isnan(self.pulled_s)


JOIN_COLUMNS = tuple(f.name for f in fields(TracedJoin))


def _read_rows(path: str | Path, columns: tuple[str, ...], kind: str) -> list[list[str]]:
    """A trace file's rows of `columns` values; a last line cut short (the process stopped
    mid-write) is skipped, a file of other columns refused."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return []
        if tuple(header) != columns:
            raise ValueError(f"{path}: not a {kind} trace (columns {header}, expected {list(columns)})")
        return [row for row in reader if len(row) == len(columns)]


def read_steps(path: str | Path) -> list[TracedStep]:
    """A trace file's steps in the order they ran; a last line cut short is skipped."""
    steps = []
    for row in _read_rows(path, STEP_COLUMNS, "step"):
        try:
            steps.append(TracedStep(float(row[0]), float(row[1]), *(int(v) for v in row[2:])))
        except ValueError:
            continue
    return steps


def read_joins(path: str | Path) -> list[TracedJoin]:
    """A join trace's requests in the order their first steps ran; a last line cut short is skipped."""
    joins = []
    for row in _read_rows(path, JOIN_COLUMNS, "join"):
        try:
            joins.append(TracedJoin(row[0], int(row[1]), *(float(v) for v in row[2:])))
        except ValueError:
            continue
    return joins


def trace_files(directory: str | Path, engine_id: str, kind: str = "steps") -> list[Path]:
    """The trace files of `kind` ("steps" or "joins") that `engine_id`'s engine cores wrote in
    `directory` (one per process), not another engine's whose id starts alike (decode-1 is not
    decode-10)."""
    prefix = f"{kind}-{engine_id}-"
    return sorted(path for path in Path(directory).glob(f"{prefix}*.csv") if path.stem[len(prefix):].isdigit())


def engine_steps(directory: str | Path, engine_id: str) -> list[TracedStep]:
    """Every step `engine_id`'s engine cores wrote in `directory`, over all its processes, in start order."""
    return sorted((step for path in trace_files(directory, engine_id) for step in read_steps(path)),
                  key=lambda step: step.start_s)


def engine_joins(directory: str | Path, engine_id: str) -> list[TracedJoin]:
    """Every join `engine_id`'s engine cores wrote in `directory`, file by file, each file's in its order."""
    return [join for path in trace_files(directory, engine_id, "joins") for join in read_joins(path)]


@dataclass(frozen=True)
class Entry:
    """A request's stamps before its first step (monotonic seconds; NaN: not seen)."""

    request_id: str
    prompt_tokens: int
    accepted_s: float
    arrived_s: float
    pulled_s: float


class StepWriter:
    """Appends one engine core's steps and joins to its two files, flushing at most every `FLUSH_S`."""

    def __init__(self, directory: str | Path, engine_id: str):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"steps-{engine_id}-{os.getpid()}.csv"
        self.joins_path = Path(directory) / f"joins-{engine_id}-{os.getpid()}.csv"
        self._file = open(self.path, "w", newline="", buffering=1 << 16)
        self._joins_file = open(self.joins_path, "w", newline="", buffering=1 << 16)
        self._csv, self._joins_csv = csv.writer(self._file), csv.writer(self._joins_file)
        self._csv.writerow(STEP_COLUMNS)
        self._joins_csv.writerow(JOIN_COLUMNS)
        self._flushed_s = time.monotonic()

    def write(self, start_s: float, end_s: float, shape: StepShape, joins: list[Entry], idle: bool) -> None:
        """The step, and the requests whose first step it was. `idle`: the engine has nothing left
        to run (the files are flushed then too, so a reader between requests sees every step)."""
        self._csv.writerow((f"{start_s:.6f}", f"{end_s:.6f}", *astuple(shape)))
        for e in joins:
            self._joins_csv.writerow((e.request_id, e.prompt_tokens, f"{e.accepted_s:.6f}", f"{e.arrived_s:.6f}",
                                      f"{e.pulled_s:.6f}", f"{start_s:.6f}", f"{end_s:.6f}"))
        if idle or end_s - self._flushed_s >= FLUSH_S:
            self._file.flush()
            self._joins_file.flush()
            self._flushed_s = end_s


class Stamps:
    """One scheduler's stamps of the requests it holds that have not run yet: `arrived` when it
    took one in, `pulled` when its KV pull was reported done, `take` at its first step. Bounded:
    past `MAX` entries (requests aborted before they ran) the oldest half goes."""

    MAX = 8192

    def __init__(self, wall_to_monotonic_s: float):
        self._offset_s = wall_to_monotonic_s
        self._arrived: dict[str, tuple[float, float, int]] = {}
        self._pulled: dict[str, float] = {}

    def arrived(self, request_id: str, accepted_wall_s: float | None, prompt_tokens: int, now_s: float) -> None:
        if request_id in self._arrived:
            return
        if len(self._arrived) >= self.MAX:
            for old in list(self._arrived)[: self.MAX // 2]:
                del self._arrived[old]
                self._pulled.pop(old, None)
        accepted_s = math.nan if accepted_wall_s is None else accepted_wall_s - self._offset_s
        self._arrived[request_id] = (accepted_s, now_s, prompt_tokens)

    def pulled(self, request_id: str, now_s: float) -> None:
        if request_id in self._arrived:
            self._pulled[request_id] = now_s

    def take(self, request_id: str) -> Entry | None:
        """The request's stamps, forgotten here; None for one never seen arriving (resumed)."""
        stamps = self._arrived.pop(request_id, None)
        pulled_s = self._pulled.pop(request_id, math.nan)
        if stamps is None:
            return None
        accepted_s, arrived_s, prompt_tokens = stamps
        return Entry(request_id, prompt_tokens, accepted_s, arrived_s, pulled_s)


def install(directory: str) -> None:
    """Wraps vLLM's `EngineCore.step` and `step_with_batch_queue` (and its scheduler's `schedule`,
    for the shape, `add_request` and the KV connector's report, for the joins) so every step that
    scheduled work, and every request's first step, is written to `directory`."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore, "_pdserve_step_trace", False):
        return
    original_schedule = Scheduler.schedule
    original_add_request = Scheduler.add_request
    original_kv_finished = Scheduler._update_from_kv_xfer_finished
    # the shapes scheduled and not yet written, each with the requests it ran first (a batch queue holds several)
    shapes: list[tuple[StepShape, list[Entry]]] = []
    writers: dict[int, StepWriter] = {}
    stamps = Stamps(wall_to_monotonic_s=time.time() - time.monotonic())

    def add_request(self, request, *args, **kwargs):
        stamps.arrived(request.request_id, getattr(request, "arrival_time", None),
                       getattr(request, "num_prompt_tokens", 0), time.monotonic())
        return original_add_request(self, request, *args, **kwargs)

    def kv_finished(self, kv_connector_output, *args, **kwargs):
        now_s = time.monotonic()
        for request_id in kv_connector_output.finished_recving or ():
            stamps.pulled(request_id, now_s)
        return original_kv_finished(self, kv_connector_output, *args, **kwargs)

    def schedule(self, *args, **kwargs):
        output = original_schedule(self, *args, **kwargs)
        if output.total_num_scheduled_tokens > 0:
            joins = [e for new in output.scheduled_new_reqs if (e := stamps.take(new.req_id)) is not None]
            shapes.append((StepShape.of(output), joins))
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
                shape, joins = shapes.pop(0)
                writer.write(start_s, time.monotonic(), shape, joins, idle=not self.scheduler.has_unfinished_requests())
            return result
        return step

    Scheduler.schedule = schedule
    Scheduler.add_request = add_request
    Scheduler._update_from_kv_xfer_finished = kv_finished
    EngineCore.step = traced(EngineCore.step, batch_queue=False)
    EngineCore.step_with_batch_queue = traced(EngineCore.step_with_batch_queue, batch_queue=True)
    EngineCore._pdserve_step_trace = True
    logger.info("vLLM engine core steps are traced to %s", directory)


def _engine_id(engine_core) -> str:
    config = getattr(getattr(engine_core, "vllm_config", None), "kv_transfer_config", None)
    return str(getattr(config, "engine_id", None) or "engine")
