"""What a request's first decode steps cost its decode engine beyond the steady step (the pure half
of `serving_probe.measure_join_warmup`).

A request pulled into a decode worker does not decode at the steady step at once. Traced on an AMX
Xeon (f6m167), one request at a time with nothing else decoding, the two steps after its join ran
1.2-1.4 ms over the request's own steady step at every context, and with a 1,433-token prompt the
excess decayed over some 30 steps (3-4 ms in all after those two; 0.5 ms with 128 tokens), in a
closed loop with no prompt beside it as much as under a Poisson load (BENCHMARKS, "A request's
first decode steps"). The profile's served step is read from batched runs whose requests join
together and then run for hundreds of steps, and its per-request CPU is the worker's API process's,
not the engine's: neither holds this. A long-prompt, short-output load pays it on every few tokens.

`warmup_excess_s` reads it off a decode engine's trace: each run of steps at one sequence that
starts with a join (one request alone, from its join to its end or the next join), the sum over
its `WARM_STEPS` steps after the join of each step over the run's steady step (the median of its
steps from `STEADY_FROM` on). The join step itself is not counted: the simulator charges it the
request's per-request CPU already. `fit_join_warmup` fits the runs as

    excess = join_warmup_s + join_warmup_s_per_context_token x context

through the median excess of each context measured (both terms >= 0), which the simulator can
charge a request's decode instance over the steps after its join (`SimSettings.join_warmup`, a
what-if: it moved one shape's TPOT toward the measured and two away).
Everything here is pure: steps in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pdserve.engine_step_trace import TracedStep

WARM_STEPS = 12      # the steps after a join whose excess is counted
STEADY_FROM = 16     # a run's steady step: the median of its steps from this one after the join on
MIN_STEADY = 8       # ... of at least this many steps
MIN_RUNS = 2         # runs of one context a fit needs


def warmup_excess_s(steps: Sequence[TracedStep]) -> list[tuple[int, float]]:
    """(context tokens at the join, excess seconds) of each run of one-sequence decode steps in
    `steps` (in start order) that begins with a join and holds at least `STEADY_FROM` +
    `MIN_STEADY` steps after it (see the module doc)."""
    runs: list[list[TracedStep] | None] = []
    for step in steps:
        alone = step.only_decodes and step.batch == 1
        if alone and step.joined:
            runs.append([step])
        elif alone and runs and runs[-1] is not None:
            runs[-1].append(step)
        elif runs and runs[-1] is not None:
            runs.append(None)   # the run ended: a step with another sequence or a prompt in it
    rows = []
    for run in filter(None, runs):
        after = [step.duration_s for step in run[1:]]
        if len(after) < STEADY_FROM + MIN_STEADY:
            continue
        steady_s = statistics.median(after[STEADY_FROM:])
        rows.append((run[0].context_tokens, sum(d - steady_s for d in after[:WARM_STEPS])))
    return rows


def fit_join_warmup(rows: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(join_warmup_s, join_warmup_s_per_context_token) through the median excess of each context
    with `MIN_RUNS` runs or more: the line through them by least squares, both terms >= 0 (a
    negative slope: the mean of the medians alone; a negative intercept: the line through the
    origin); one context: its median, all fixed. None where no context had enough runs."""
    by_context: dict[int, list[float]] = {}
    for context, excess_s in rows:
        by_context.setdefault(context, []).append(excess_s)
    points = sorted((context, statistics.median(v)) for context, v in by_context.items() if len(v) >= MIN_RUNS)
    if not points:
        return None
    xs, ys = [float(x) for x, _ in points], [y for _, y in points]
    if len(points) == 1:
        return max(0.0, ys[0]), 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
             / sum((x - mean_x) ** 2 for x in xs))
    intercept = mean_y - slope * mean_x
    if slope < 0:
        return max(0.0, mean_y), 0.0
    if intercept < 0:
        return 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return intercept, slope


def warmup_lines(rows: Sequence[tuple[int, float]], fit: tuple[float, float] | None) -> list[str]:
    """What the profile says of the runs: each context's runs and median excess, and the fit."""
    by_context: dict[int, list[float]] = {}
    for context, excess_s in rows:
        by_context.setdefault(context, []).append(excess_s)
    lines = [f"{context}-token context: {len(v)} runs, {statistics.median(v) * 1e3:+.2f} ms over the steady step "
             f"in the {WARM_STEPS} steps after the join" for context, v in sorted(by_context.items())]
    if fit is not None:
        lines.append(f"the line {fit[0] * 1e3:.2f} ms + {fit[1] * 1e6:.2f} us x context (what `--join-warmup "
                     f"profile` charges over a request's first decode steps)")
    return lines
