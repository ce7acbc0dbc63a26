"""The pure half of the co-run probe (`planner.profiler.corun_probe`, which measures): its plan, and
the stretches read off the two engines' traced steps. No I/O: plain values in and out.

The probe runs phases. In each, one engine works throughout (the "busy" side: a batch held
decoding, or prompts back to back) while the other alternates on a fixed schedule: `window_s` of
its own work, then `window_s` idle, `CorunPlan.cycles` times. Both engine cores trace their steps
(`pdserve.engine_step_trace`), and every step of the busy side is then either beside the other
engine or alone, a few hundred milliseconds from steps of the other kind. Each cycle's ratio is
the median of its steps beside over the median of its steps alone, and the phase's stretch is the
median over its cycles (`CorunMeasure.ratio`): a host whose speed drifts over seconds moves both
sides of every cycle's ratio, and a cycle it stalled is one ratio of a dozen or more. The cycles'
10th-90th percentile is the measurement's spread, printed beside it.

The probe this replaced timed alone, together, alone again, one measurement each, and left out a
round whose two alones differed by 15%. On a 2-vCPU Zen 4 EPYC two profiles 50 minutes apart kept a
decode step's stretch of 1.302 and 0.946 from 2 of 6 rounds each, where the traces of a loaded
cluster on the same VM showed 1.06-1.19 at a batch of one (BENCHMARKS, "The hops beside the prefill
engine's steps").

A decode step is beside the prompts when the prompt engine stepped throughout it, alone when the
prompt engine stepped through none of it (`planner.validation_steps.corun_by_batch` reads a
loaded cluster's traces the same way). A prompt's first step is beside the decoding when it lies
within one unbroken run of the decode engine's steps (`decode_runs`: no gap over `RUN_GAP_S`; the
engine's own work between steps is part of decoding), alone when no decode step overlaps it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pdserve.engine_step_trace import TracedStep
from planner.serving_costs import CORUN_RANGE
from planner.validation_joins import busy_share, in_start_order
from planner.validation_steps import prompt_steps, steady_decode_steps

MIN_WINDOW_S = 0.3       # the alternating side's shortest window of work (and of idling)
PROMPTS_PER_WINDOW = 2   # ... and at least this many prompts' time alone
RUN_GAP_S = 0.1          # a longer gap between two decode steps ends a run of decoding
MIN_DECODE_STEPS = 3     # decode steps of each kind a cycle needs to count
MIN_PROMPTS = 1          # prompts of each kind a cycle needs to count


@dataclass(frozen=True)
class CorunPlan:
    prompt_tokens: int = 1024
    decode_batches: tuple[int, ...] = (1, 4, 16)   # the held batches whose steps are measured beside prompts
    prompt_batch: int = 16          # the held batch beside which prompts are measured
    hold_context_tokens: int = 64   # per request of a held batch
    hold_tokens: int = 512          # ... and each request's length before the batch starts again
    cycles: int = 12                # windows of work and idle per phase, at least ...
    phase_s: float = 15.0           # ... and as many as fill this long (`phase_cycles`)
    repeats: int = 3                # prefills timing the prompt alone, which sizes the windows

    @property
    def phases(self) -> tuple[tuple[str, int], ...]:
        """(what is measured, the held batch) in the order measured: the decode step at each batch
        beside prompts, then the prompt beside a batch."""
        return tuple(("decode", batch) for batch in self.decode_batches) + (("prompt", self.prompt_batch),)

    @property
    def steps(self) -> int:
        """Progress steps: the two engines up, then one a phase."""
        return 1 + len(self.phases)


def corun_plan(max_model_len: int, max_num_seqs: int, kv_tokens: int, quick: bool) -> CorunPlan:
    """The profile's plan: a prompt of 1,024 tokens (the trace's typical length; 256 `quick`) within
    the context, decode batches of 1, 4 and 16 (at most `max_num_seqs`; `quick` 16 only), prompts
    beside a batch of 16, phases of 15 s and at least 12 cycles (`quick` 3 s and 4). A held
    batch's requests start from 64-token prompts and decode up to 512 tokens each, within the
    context and the `kv_tokens` the KV cache holds (nothing is preempted), then start again: its
    prefills are a small part of its time."""
    prompt = min(256 if quick else 1024, max_model_len - 1)
    batch = max(1, min(16, max_num_seqs))
    batches = (batch,) if quick else tuple(sorted({max(1, min(b, max_num_seqs)) for b in (1, 4, 16)}))
    hold_context = max(1, min(64, max_model_len // 4))
    hold = max(2, min(512, max_model_len - hold_context - 1, kv_tokens // batch - hold_context - 1))
    return CorunPlan(prompt, batches, batch, hold_context, hold, cycles=4 if quick else 12,
                     phase_s=3.0 if quick else 15.0)


def window_s(prompt_alone_s: float) -> float:
    """The alternating side's window of work, and of idling after it: `PROMPTS_PER_WINDOW` prompts'
    time alone, at least `MIN_WINDOW_S` (so a window holds decode steps of every kind and a few
    prompts, and a host's drift over seconds is the same on both sides of a cycle)."""
    return max(MIN_WINDOW_S, PROMPTS_PER_WINDOW * prompt_alone_s)


def phase_cycles(plan: CorunPlan, window: float) -> int:
    """A phase's cycles of 2 x `window`: enough to fill `plan.phase_s`, at least `plan.cycles`. One
    cycle's ratio moves by 10-30% on a shared 2-vCPU VM (a tiny model's decode step: 0.71-1.66 over
    eight cycles of 0.6 s once); the median of 25 moves far less than that of 8."""
    return max(plan.cycles, math.ceil(plan.phase_s / (2 * window)))


@dataclass(frozen=True)
class CorunMeasure:
    """One phase: a decode step's (`what` "decode", at `batch`) or a prompt's (`what` "prompt",
    beside a held batch of `batch`) stretch beside the other engine: each cycle's ratio of its
    steps beside over its steps alone (medians), for the cycles that had both, and the steps of
    each kind in them."""

    what: str
    batch: int
    cycle_ratios: tuple[float, ...]
    beside_steps: int
    alone_steps: int

    @property
    def ratio(self) -> float:
        """The median over the cycles: what the profile keeps."""
        return float(statistics.median(self.cycle_ratios))

    @property
    def spread(self) -> tuple[float, float]:
        """The cycles' 10th and 90th percentiles."""
        low, high = np.percentile(self.cycle_ratios, [10, 90])
        return float(low), float(high)

    def shown(self) -> str:
        low, high = self.spread
        return (f"{self.ratio:.3f}x (cycles {low:.2f}-{high:.2f}, {len(self.cycle_ratios)} of them; "
                f"{self.beside_steps} steps beside, {self.alone_steps} alone)")


def decode_runs(steps: Sequence[TracedStep], max_gap_s: float = RUN_GAP_S) -> list[tuple[float, float]]:
    """(start, end) of each unbroken run of `steps`: consecutive steps (in start order) no more than
    `max_gap_s` apart."""
    runs: list[list[float]] = []
    for step in sorted(steps, key=lambda s: s.start_s):
        if runs and step.start_s - runs[-1][1] <= max_gap_s:
            runs[-1][1] = max(runs[-1][1], step.end_s)
        else:
            runs.append([step.start_s, step.end_s])
    return [(start, end) for start, end in runs]


def decode_corun(decode: Sequence[TracedStep], prompt: Sequence[TracedStep], start_s: float, cycle_s: float,
                 cycles: int, batch: int) -> CorunMeasure:
    """The stretch of the decode engine's steps of `batch` (no request joining) that the prompt
    engine stepped throughout over those it stepped through none of, in the `cycles` cycles of
    `cycle_s` from `start_s` (`_by_cycle`)."""
    ordered, starts = in_start_order(prompt)
    samples = []
    for step in steady_decode_steps(decode):
        if step.decoding != batch:
            continue
        share = busy_share(ordered, starts, step.start_s, step.end_s)
        if share >= 0.99 or share <= 0.01:
            samples.append((step.start_s, step.duration_s, share >= 0.99))
    return _by_cycle("decode", batch, samples, start_s, cycle_s, cycles, MIN_DECODE_STEPS)


def prompt_corun(prompt: Sequence[TracedStep], decode: Sequence[TracedStep], start_s: float, cycle_s: float,
                 cycles: int, batch: int) -> CorunMeasure:
    """The stretch of the prompt engine's prompt steps (`prompt_steps`: a chunked prompt's first)
    within one run of the decode engine's steps (`decode_runs`) over those no decode step overlaps,
    in the `cycles` cycles of `cycle_s` from `start_s` (`_by_cycle`); `batch` the held batch."""
    runs = decode_runs(decode)
    run_starts = np.array([start for start, _ in runs])
    ordered, starts = in_start_order(decode)
    samples = []
    for i in prompt_steps(prompt):
        step = prompt[i]
        r = int(np.searchsorted(run_starts, step.start_s, side="right")) - 1
        if r >= 0 and runs[r][0] <= step.start_s and step.end_s <= runs[r][1]:
            samples.append((step.start_s, step.duration_s, True))
        elif busy_share(ordered, starts, step.start_s, step.end_s) == 0.0:
            samples.append((step.start_s, step.duration_s, False))
    return _by_cycle("prompt", batch, samples, start_s, cycle_s, cycles, MIN_PROMPTS)


def _by_cycle(what: str, batch: int, samples: Sequence[tuple[float, float, bool]], start_s: float,
              cycle_s: float, cycles: int, min_each: int) -> CorunMeasure:
    """`samples` (start, seconds, beside) grouped by cycle (of `cycle_s` from `start_s`; outside the
    `cycles` cycles left out), each cycle with at least `min_each` of both kinds one ratio of the
    medians. ValueError when no cycle has both: the phase measured nothing comparable."""
    beside: list[list[float]] = [[] for _ in range(cycles)]
    alone: list[list[float]] = [[] for _ in range(cycles)]
    for at_s, seconds, is_beside in samples:
        k = int((at_s - start_s) // cycle_s)
        if 0 <= k < cycles:
            (beside if is_beside else alone)[k].append(seconds)
    kept = [(b, a) for b, a in zip(beside, alone) if len(b) >= min_each and len(a) >= min_each]
    if not kept:
        raise ValueError(f"the {what} phase (batch {batch}) had no cycle with {min_each}+ steps both beside "
                         f"the other engine and alone ({sum(map(len, beside))} beside, {sum(map(len, alone))} alone "
                         f"in {cycles} cycles of {cycle_s:.2f} s)")
    return CorunMeasure(what, batch, tuple(statistics.median(b) / statistics.median(a) for b, a in kept),
                        sum(len(b) for b, _ in kept), sum(len(a) for _, a in kept))


def corun_stretches(measures: Sequence[CorunMeasure]) -> tuple[float | None, float | None]:
    """(prompt, decode step): the prompt phase's ratio, and the median of the decode phases' (one
    per batch: the simulator charges one stretch at every batch); None for a kind no phase measured."""
    prompts = [m.ratio for m in measures if m.what == "prompt"]
    steps = [m.ratio for m in measures if m.what == "decode"]
    return (statistics.median(prompts) if prompts else None), (statistics.median(steps) if steps else None)


def chargeable_stretch(measured: float) -> float:
    """The stretch the profile keeps for a `measured` one: within `CORUN_RANGE`, rounded to 4
    places. Outside it the measurement is broken (a host that stalled one side), and the bound is
    closer to the truth than the number; the profile's note shows both."""
    low, high = CORUN_RANGE
    return round(min(high, max(low, measured)), 4)
