"""What a loaded decode worker's gap is made of: its engine's traced steps (`pdserve.engine_step_trace`)
against the profile's model, beside the clients' gaps over the same run.

A client's steady gap is the engine's cycle (one step and the engine core's work before the next)
plus the change in the delivery lag from engine to client, which cancels over a request's tokens.
So the token-weighted client gap and the token-weighted engine cycle agree when the serving path
adds only latency; where the client's is larger, the path (the worker's API process, the router,
the client) holds tokens back. The engine's cycle splits into:
- `step`: the step itself, measured, beside `model`, the profile's engine step for the same batch
  and context (`PerfModel.decode_step_s`); their ratio is the stretch the step took under load
  (the host's other processes on its core, the pulled KV a join copies in);
- `between`: the engine core's own time from a step's end to the next one's start, counted only
  where the next step continues a request of this one (the engine had work: not idleness);
- `served`: what the simulator adds to the engine's step (`ServingCosts.decode_serving_s`, the
  line from the profile's idle runs) for comparison with step + between - model.
`fit_step_extra` fits what the steps add over the model, a + b x batch (+ c x context), and
`corun_by_batch` sets the steps the prefill engine ran beside against those it left alone.

A prefill worker's steps (`prefill_worker_summary`) are set against the model's prompt step the
same way: their stretch is what the host's load on the prefill core (the router bound there, a
client) and the cluster's own work cost each prompt.

Everything here is pure: steps in, rows out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pdserve.engine_step_trace import TracedStep
from planner.validation_joins import busy_share, in_start_order

BATCH_BUCKETS = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 1 << 20))


def bucket_label(low: int, high: int) -> str:
    return str(low) if low == high else (f"{low}+" if high >= 1 << 20 else f"{low}-{high}")


@dataclass(frozen=True)
class StepRow:
    """Steps of one kind (batch bucket; with a join or without), means in seconds."""

    label: str
    joins: bool
    steps: int
    batch: float
    step_s: float
    model_s: float
    between_s: float     # NaN where no step of the row was followed by a continuing one
    served_s: float      # the simulator's serving extra at the row's mean batch

    @property
    def stretch(self) -> float:
        return self.step_s / self.model_s if self.model_s > 0 else float("nan")


def between_s(steps: Sequence[TracedStep]) -> np.ndarray:
    """Per step, the time from its end to the next step's start where the next continues requests
    (the engine had work), else NaN (the last step, or the engine went idle before the next)."""
    out = np.full(len(steps), np.nan)
    for i in range(len(steps) - 1):
        if steps[i + 1].continuing > 0:
            out[i] = steps[i + 1].start_s - steps[i].end_s
    return out


def decode_steps(steps: Sequence[TracedStep], start_s: float = -np.inf, end_s: float = np.inf) -> list[int]:
    """Indexes of the steps that only decode (every scheduled request computed one token: a decode
    worker's steps, joins included, since a pulled prompt's join computes its last token), started
    within [start_s, end_s)."""
    return [i for i, s in enumerate(steps) if s.only_decodes and start_s <= s.start_s < end_s]


def step_rows(steps: Sequence[TracedStep], indexes: Sequence[int], model_step_s: Callable[[int, int], float],
              served_s: Callable[[int], float]) -> list[StepRow]:
    """`indexes`' steps grouped by batch bucket and by whether a request joined, each group's means:
    the measured step, `model_step_s(batch, context_tokens)`, the time to the next step (`between_s`),
    `served_s(batch)` at the group's mean batch rounded."""
    gaps = between_s(steps)
    rows = []
    for joins in (False, True):
        for low, high in BATCH_BUCKETS:
            chosen = [i for i in indexes if low <= steps[i].batch <= high and (steps[i].joined > 0) == joins]
            if not chosen:
                continue
            group = [steps[i] for i in chosen]
            batch = float(np.mean([s.batch for s in group]))
            between = gaps[chosen]
            rows.append(StepRow(
                label=bucket_label(low, high), joins=joins, steps=len(group), batch=batch,
                step_s=float(np.mean([s.duration_s for s in group])),
                model_s=float(np.mean([model_step_s(s.batch, s.context_tokens) for s in group])),
                between_s=float(np.nanmean(between)) if np.isfinite(between).any() else float("nan"),
                served_s=served_s(round(batch))))
    return rows


@dataclass(frozen=True)
class CycleSummary:
    """Token-weighted means over a run's decode steps (each step weighs as the tokens it gave
    clients): the engine's step, the model's step, the time to the next step, the cycle (step +
    between, where the next continued), and the simulator's served extra."""

    tokens: int
    step_s: float
    model_s: float
    between_s: float
    cycle_s: float
    served_s: float


def cycle_summary(steps: Sequence[TracedStep], indexes: Sequence[int], model_step_s: Callable[[int, int], float],
                  served_s: Callable[[int], float]) -> CycleSummary:
    """`step_rows`' terms over all of `indexes` at once, each step weighted by its `decoding` tokens.
    The cycle is taken over the steps followed by a continuing one (a step after which the engine
    went idle ends no gap any request sees)."""
    gaps = between_s(steps)
    weights = np.array([steps[i].decoding for i in indexes], dtype=float)
    if not len(indexes) or weights.sum() == 0:
        nan = float("nan")
        return CycleSummary(0, nan, nan, nan, nan, nan)
    step = np.array([steps[i].duration_s for i in indexes])
    model = np.array([model_step_s(steps[i].batch, steps[i].context_tokens) for i in indexes])
    served = np.array([served_s(steps[i].batch) for i in indexes])
    between = gaps[list(indexes)]
    busy = np.isfinite(between)
    mean = lambda values, mask=slice(None): float(np.average(values[mask], weights=weights[mask]))  # noqa: E731
    return CycleSummary(
        tokens=int(weights.sum()), step_s=mean(step), model_s=mean(model), served_s=mean(served),
        between_s=mean(between, busy) if busy.any() and weights[busy].sum() > 0 else float("nan"),
        cycle_s=mean(step + np.nan_to_num(between), busy) if busy.any() and weights[busy].sum() > 0 else float("nan"))


def client_steady_gap_s(chunk_times: Sequence[Sequence[float]], output_tokens: Sequence[int]) -> float:
    """The clients' token-weighted steady gap: sum over requests of (last - second token) over the sum
    of their (output - 2), requests of three tokens or more (`planner.validation_phases`' steady gap,
    weighted as the engine's cycle is)."""
    spans, tokens = 0.0, 0
    for times, n in zip(chunk_times, output_tokens):
        if n >= 3 and len(times) >= 3:
            spans += times[-1] - times[1]
            tokens += n - 2
    return spans / tokens if tokens else float("nan")


def decode_worker_summary(steps: Sequence[TracedStep], start_s: float, end_s: float,
                          model_step_s: Callable[[int, int], float], served_s: Callable[[int], float]) -> dict:
    """One decode worker's steps that started in [start_s, end_s) (a run's window), for a report
    and validation.json: the token-weighted means (`cycle_summary`) and the rows by batch
    (`step_rows`), in milliseconds."""
    indexes = decode_steps(steps, start_s, end_s)
    cycle = cycle_summary(steps, indexes, model_step_s, served_s)
    ms = lambda seconds: None if not np.isfinite(seconds) else round(seconds * 1e3, 4)  # noqa: E731
    window_steps = [s for s in steps if start_s <= s.start_s < end_s]
    busy_s = sum(s.duration_s for s in window_steps)
    return {
        "steps": len(indexes), "tokens": cycle.tokens,
        "busy_share": round(busy_s / (end_s - start_s), 4) if end_s > start_s else None,
        "step_ms": ms(cycle.step_s), "model_ms": ms(cycle.model_s), "between_ms": ms(cycle.between_s),
        "cycle_ms": ms(cycle.cycle_s), "served_extra_ms": ms(cycle.served_s),
        "rows": [{"batch": row.label, "joins": row.joins, "steps": row.steps, "mean_batch": round(row.batch, 2),
                  "step_ms": ms(row.step_s), "model_ms": ms(row.model_s), "between_ms": ms(row.between_s),
                  "served_extra_ms": ms(row.served_s)}
                 for row in step_rows(steps, indexes, model_step_s, served_s)],
    }


@dataclass(frozen=True)
class StepExtraFit:
    """What a served decode step adds to the profile's engine step, fitted on traced steps:
    extra = `per_step_s` + `per_seq_s` x batch + `per_context_token_s` x context, seconds, least
    squares over `steps` decode steps without a join; `mean_abs_error` is the fit's mean |miss|
    over the mean measured step (0.1: 10%)."""

    per_step_s: float
    per_seq_s: float
    per_context_token_s: float
    steps: int
    mean_abs_error: float

    def extra_s(self, batch: float, context_tokens: float) -> float:
        return self.per_step_s + self.per_seq_s * batch + self.per_context_token_s * context_tokens


def steady_decode_steps(steps: Sequence[TracedStep]) -> list[TracedStep]:
    """The decode steps no request joined (a join's step also loads its KV: charged apart)."""
    return [s for s in steps if s.only_decodes and s.joined == 0]


def fit_step_extra(steps: Sequence[TracedStep], model_step_s: Callable[[int, int], float],
                   with_context: bool = True) -> StepExtraFit:
    """`StepExtraFit` of the decode steps among `steps` that no request joined (a join's step also
    loads its KV: charged apart), against `model_step_s(batch, context_tokens)`; without
    `with_context` the context term is 0. ValueError with fewer steps than terms."""
    chosen = steady_decode_steps(steps)
    terms = 3 if with_context else 2
    if len(chosen) < terms:
        raise ValueError(f"{len(chosen)} decode steps without a join: too few to fit {terms} terms")
    features = np.array([[1.0, s.batch, s.context_tokens][:terms] for s in chosen])
    measured = np.array([s.duration_s for s in chosen])
    extra = measured - np.array([model_step_s(s.batch, s.context_tokens) for s in chosen])
    coef, *_ = np.linalg.lstsq(features, extra, rcond=None)
    misses = np.abs(features @ coef - extra)
    return StepExtraFit(per_step_s=float(coef[0]), per_seq_s=float(coef[1]),
                        per_context_token_s=float(coef[2]) if with_context else 0.0, steps=len(chosen),
                        mean_abs_error=float(misses.mean() / measured.mean()))


def prompt_steps(steps: Sequence[TracedStep], start_s: float = -np.inf, end_s: float = np.inf) -> list[int]:
    """Indexes of the steps that computed prompts and nothing else: requests new to the batch,
    none continuing, none decoding (a prefill worker's steps; a prompt chunked over several steps
    shows only its first here), started within [start_s, end_s)."""
    return [i for i, s in enumerate(steps)
            if s.joined > 0 and s.continuing == 0 and s.decoding == 0 and start_s <= s.start_s < end_s]


def prefill_worker_summary(steps: Sequence[TracedStep], start_s: float, end_s: float,
                           model_prompt_step_s: Callable[[int, float], float]) -> dict:
    """A prefill worker's prompt steps in [start_s, end_s) against `model_prompt_step_s(tokens,
    attention_units)` (`PerfModel.prefill_step_s`), a step of n prompts taken as n of equal length
    (units n x (tokens / n)^2; the trace keeps no lengths apart): their count, the means in ms, the
    median stretch (measured over model), the steps of several prompts, the engine's busy share."""
    indexes = prompt_steps(steps, start_s, end_s)
    window = [s for s in steps if start_s <= s.start_s < end_s]
    busy = round(sum(s.duration_s for s in window) / (end_s - start_s), 4) if end_s > start_s else None
    if not indexes:
        return {"steps": 0, "busy_share": busy}
    chosen = [steps[i] for i in indexes]
    measured = np.array([s.duration_s for s in chosen])
    model = np.array([model_prompt_step_s(s.tokens, s.joined * (s.tokens / s.joined) ** 2) for s in chosen])
    return {"steps": len(chosen), "step_ms": round(float(measured.mean()) * 1e3, 4),
            "model_ms": round(float(model.mean()) * 1e3, 4),
            "median_stretch": round(float(np.median(measured / model)), 4),
            "several_prompts": sum(1 for s in chosen if s.joined > 1), "busy_share": busy}


def prompt_stretch_by_decode_batch(prefill: Sequence[TracedStep], decode: Sequence[TracedStep], start_s: float,
                                   end_s: float, model_prompt_step_s: Callable[[int, float], float],
                                   min_steps: int = 5) -> dict[str, dict]:
    """A prefill worker's prompt steps in [start_s, end_s) (`prompt_steps`) by the decode batch
    streaming when each began (the decode engine's step running then, or the last one that ended
    within 0.2 s; 0 where none: the decode worker idle), per `BATCH_BUCKETS` bucket ("0" first)
    with at least `min_steps`: how many and their median stretch (measured over
    `model_prompt_step_s`, as `prefill_worker_summary` reads it), and where their lengths span
    enough (`step_loss_fit`) the time a step lost whatever its length (`lost_ms`) and the `slope`
    of the rest. Where the tokens the decodes stream share the prefill core with the router, the
    stretch grows with that batch."""
    ordered, starts = in_start_order(decode)
    buckets: dict[str, list[tuple[float, float]]] = {}   # (model, measured) seconds
    for i in prompt_steps(prefill, start_s, end_s):
        step = prefill[i]
        k = int(np.searchsorted(starts, step.start_s, side="right")) - 1
        batch = ordered[k].decoding if k >= 0 and step.start_s - ordered[k].end_s < 0.2 else 0
        model = model_prompt_step_s(step.tokens, step.joined * (step.tokens / step.joined) ** 2)
        buckets.setdefault(decode_batch_label(batch), []).append((model, step.duration_s))
    return _stretch_rows(buckets, min_steps)


def simulated_prompt_stretch_by_decode_batch(prefill_steps: np.ndarray, min_steps: int = 5) -> dict[str, dict]:
    """The simulator's prompt steps (`SimResult.prefill_steps`: start, duration, the model's step,
    the decode batch beside) as `prompt_stretch_by_decode_batch` reads the traced ones: per bucket
    with at least `min_steps`, how many, their median stretch (duration over the model's step) and
    where their lengths span enough the line's lost time and slope. The simulator's duration holds
    the worker's per-prompt CPU, as the traced step holds what that CPU took of its core."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    for _start_s, duration_s, model_s, batch in np.asarray(prefill_steps, dtype=float).reshape(-1, 4):
        if model_s > 0:
            buckets.setdefault(decode_batch_label(int(batch)), []).append((model_s, duration_s))
    return _stretch_rows(buckets, min_steps)


def simulated_decode_stretch_by_batch(decode_steps: np.ndarray, min_steps: int = 5) -> dict[str, dict]:
    """The simulator's decode steps without a join (`SimResult.decode_steps`: start, duration, the
    model's step plus the served line, batch, joins) per `BATCH_BUCKETS` bucket with at least
    `min_steps`: how many, and their time over what the model and the served line put (sum over
    sum: the stretch the host model, the co-run and the drawn spread gave them), as
    `measured_decode_stretch` reads a traced decode worker's."""
    sums: dict[str, list[float]] = {}
    for _start_s, duration_s, served_s, batch, joins in np.asarray(decode_steps, dtype=float).reshape(-1, 5):
        if joins == 0 and batch > 0:
            total = sums.setdefault(decode_batch_label(int(batch)), [0.0, 0.0, 0])
            total[0], total[1], total[2] = total[0] + duration_s, total[1] + served_s, total[2] + 1
    return _sum_ratio_rows(sums, min_steps)


def measured_decode_stretch(workers: dict[str, dict], min_steps: int = 5) -> dict[str, dict]:
    """A run's traced decode workers' steps without a join (`decode_worker_summary`'s rows, under
    `engine_steps`' "workers") per bucket with at least `min_steps` over every worker: how many, and
    their mean step over the profile's model plus its served line at the same batch (sum over sum)."""
    sums: dict[str, list[float]] = {}
    for worker in workers.values():
        for row in worker.get("rows", []):
            if row.get("joins") or not row.get("steps"):
                continue
            total = sums.setdefault(row["batch"], [0.0, 0.0, 0])
            total[0] += row["step_ms"] * row["steps"]
            total[1] += (row["model_ms"] + row["served_extra_ms"]) * row["steps"]
            total[2] += row["steps"]
    return _sum_ratio_rows(sums, min_steps)


def _sum_ratio_rows(sums: dict[str, list[float]], min_steps: int) -> dict[str, dict]:
    """Bucket label -> [time, yardstick, steps] summed, to rows by rising batch: those with at least
    `min_steps` steps, their count and time over yardstick."""
    return {label: {"steps": int(sums[label][2]), "stretch": round(sums[label][0] / sums[label][1], 4)}
            for label in [bucket_label(low, high) for low, high in BATCH_BUCKETS]
            if label in sums and sums[label][2] >= min_steps and sums[label][1] > 0}


def decode_batch_label(batch: int) -> str:
    """The `BATCH_BUCKETS` label of a decode batch, "0" for none (the decode side idle)."""
    return "0" if batch <= 0 else next(bucket_label(low, high) for low, high in BATCH_BUCKETS if low <= batch <= high)


def _stretch_rows(buckets: dict[str, list[tuple[float, float]]], min_steps: int) -> dict[str, dict]:
    """(model, measured) seconds by bucket label -> the rows of `prompt_stretch_by_decode_batch`,
    "0" first, then by rising batch."""
    rows = {}
    for label in ["0", *(bucket_label(low, high) for low, high in BATCH_BUCKETS)]:
        pairs = np.array(buckets.get(label, ()), dtype=float).reshape(-1, 2)
        if len(pairs) < min_steps:
            continue
        row = {"steps": len(pairs), "median_stretch": round(float(np.median(pairs[:, 1] / pairs[:, 0])), 4)}
        if (fit := step_loss_fit(pairs[:, 0], pairs[:, 1])) is not None:
            row["lost_ms"], row["slope"], row["line_error"] = round(fit[0] * 1e3, 4), round(fit[1], 4), round(fit[2], 4)
        rows[label] = row
    return rows


MIN_LOSS_FIT_SPAN = 2.0   # the longest model step a loss fit reads over its shortest


def step_loss_fit(model_s: np.ndarray, measured_s: np.ndarray,
                  min_span: float = MIN_LOSS_FIT_SPAN) -> tuple[float, float, float] | None:
    """measured = lost_s + slope x model, by least absolute deviations (a few steps a GC pause or a
    burst of the router's doubled must not set the line): what a step loses whatever its length
    (a wake-up the engine waits through) apart from what grows with it (a share of its core
    taken), and the line's error (mean |measured - line| / measured). None where the model steps
    span less than `min_span` (longest over shortest), or fewer than 3: a ratio alone is all such
    steps can say."""
    model_s, measured_s = np.asarray(model_s, dtype=float), np.asarray(measured_s, dtype=float)
    if len(model_s) < 3 or not model_s.min() > 0 or model_s.max() / model_s.min() < min_span:
        return None
    design = np.column_stack([np.ones_like(model_s), model_s])
    weights = np.ones_like(model_s)
    coef = np.zeros(2)
    for _ in range(50):   # iteratively reweighted least squares toward the L1 line
        coef, *_ = np.linalg.lstsq(design * weights[:, None], measured_s * weights, rcond=None)
        residual = np.abs(measured_s - design @ coef)
        weights = 1.0 / np.sqrt(np.maximum(residual, 1e-6 * float(np.median(measured_s))))
    error = float(np.mean(np.abs(measured_s - design @ coef) / measured_s))
    return float(coef[0]), float(coef[1]), error


MIN_CORUN_STEPS = 20  # steps on each side of a batch bucket before `corun_by_batch` sets them side by side


@dataclass(frozen=True)
class CorunRow:
    """One batch bucket's decode steps (no join): the median of those the prefill engine stepped
    beside throughout (`beside_s`) and of those it was idle through (`alone_s`), and how many."""
    batch: str
    beside_s: float
    alone_s: float
    beside_steps: int
    alone_steps: int

    @property
    def ratio(self) -> float:
        return self.beside_s / self.alone_s


def corun_by_batch(decode: Sequence[TracedStep], prefill: Sequence[TracedStep],
                   min_steps: int = MIN_CORUN_STEPS) -> list[CorunRow]:
    """Per batch bucket with at least `min_steps` steps on each side, the co-run stretch a loaded
    cluster showed: its decode engine's steps (`steady_decode_steps`) that a prefill engine's steps
    covered throughout against those it stepped none of. The profile's `corun_decode_stretch` is
    one batch at one context, measured by two engines alone (`planner.profiler.corun_probe`); here
    the prefill core also holds the router, so its load is in the ratio too."""
    ordered, starts = in_start_order(prefill)
    steady = steady_decode_steps(decode)
    shares = {id(step): busy_share(ordered, starts, step.start_s, step.end_s) for step in steady}
    rows = []
    for low, high in BATCH_BUCKETS:
        chosen = [step for step in steady if low <= step.batch <= high]
        beside = [step.duration_s for step in chosen if shares[id(step)] >= 0.99]
        alone = [step.duration_s for step in chosen if shares[id(step)] <= 0.01]
        if len(beside) >= min_steps and len(alone) >= min_steps:
            rows.append(CorunRow(bucket_label(low, high), float(np.median(beside)), float(np.median(alone)),
                                 len(beside), len(alone)))
    return rows
