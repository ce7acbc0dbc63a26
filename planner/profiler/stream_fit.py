"""The batched runs' half of the serving probe's fits (`planner.profiler.serving_probe` measures;
`planner.profiler.serving_fit` plans the runs and fits the per-request CPU): B requests decoding
together, read where the batch has settled, turned into the served decode step's terms and the
unbound processes' CPU per step and per token streamed. No I/O here: plain values in, plain values out.

The forms fitted:
- served decode step / the host's stretch - engine step = decode_step_s + decode_cpu_s_per_token * B
  over batched runs of B requests, each read where it has settled (`settled_window`;
  `fit_served_steps`), the engine step from the engine table's own row (`engine_step_s`), the
  host's stretch the simulator's (`planner.simulator.host`, `StreamCpu.decode_stretch`);
- the host's and the router's CPU per decode step and per token streamed, cpu = w * steps + t * tokens
  over the batched runs' steady windows (`stream_cpu_terms`); where a run measured no window (an
  older probe's runs), per token alone from the largest batch (`unbound_cpu_per_token`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from planner.perf_model import PerfModel
from planner.profile import DecodeSample
from planner.profiler.plan import SHORT_CONTEXT
from planner.serving_costs import ServingCosts

# A batched run's outputs are long enough that its steps are read where the batch has settled and
# its context is what served requests decode at: over the late half of the window in which all
# decode together (`settled_window`), 100-250 tokens of context a sequence. Read over all of a
# 64-token window (16-48 tokens a sequence), the served step's cost per sequence came out 262 us on
# the Zen 3 EPYC where streams that kept decoding measured 155-170, and the simulator over-charged
# the decodes of a loaded cluster by 20-30% (BENCHMARKS, "Across shapes on an AVX2-only EPYC").
BATCH_PROMPT_TOKENS, BATCH_OUTPUT_TOKENS = SHORT_CONTEXT, 256


@dataclass(frozen=True)
class BatchRun:
    """B requests decoding together: what a step took as the client saw it."""

    batch: int
    step_s: float            # median gap between a request's tokens while all B decode
    context_tokens: float    # the batch's total context at the middle of that window
    tokens_per_s: float      # tokens the client received per second over the window
    host_cpu_s: float        # the router's and this process's CPU over the whole run
    tokens: int
    gaps_s: tuple[float, ...] = ()  # every gap inside the window (its median is step_s)
    router_cpu_s: float = 0.0       # the router's part of host_cpu_s (0: not measured apart)
    window: StreamWindow | None = None  # the unbound processes' CPU while all B streamed (None: not read)
    # the settled window step_s was read over (`time.perf_counter` s; 0, 0: not kept)
    start_s: float = 0.0
    end_s: float = 0.0


@dataclass(frozen=True)
class StreamWindow:
    """The unbound processes' CPU over a stretch of a batched run in which every request streamed:
    read when the last request had its second token and again when the first one ended."""

    seconds: float
    tokens: int          # tokens the client received in it
    host_cpu_s: float    # the router's and the client's
    router_cpu_s: float  # the router's part


@dataclass(frozen=True)
class StreamCpu:
    """CPU seconds the router and the client (host) take per decode step that streams and per token
    it streams (the router's part of each at most the host's)."""

    host_per_step_s: float = 0.0
    host_per_token_s: float = 0.0
    router_per_step_s: float = 0.0
    router_per_token_s: float = 0.0

    def host_load_cores(self, tokens_per_s: float, batch: float) -> tuple[float, float]:
        """(the client's, the router's) load in cores while `batch` streams get `tokens_per_s` in all."""
        steps_per_s = tokens_per_s / max(1.0, batch)
        router = self.router_per_step_s * steps_per_s + self.router_per_token_s * tokens_per_s
        host = self.host_per_step_s * steps_per_s + self.host_per_token_s * tokens_per_s
        return host - router, router

    def decode_stretch(self, tokens_per_s: float, batch: float, host_cores: float, engine_cores: float = 1.0,
                       client_placement: str = "router-room", beside_prompt: bool = False) -> float:
        """How much longer than its engine time a decode step takes while `batch` streams get
        `tokens_per_s` and nothing else steps (`beside_prompt`: while a prefill engine steps on a
        core of its own, the router's where it is bound): the simulator's host model
        (`planner.simulator.host`) for the decode engine, over `engine_cores` of the host's cores.
        Where it leaves a core (a cluster's decode worker), the router is bound to the prefill core
        where it is measured apart; an engine over every core (vLLM's server) leaves none, and its
        front end floats and holds the whole step (the team stretch), as the simulator charges it;
        the client placed beside the bound router by `client_placement` (`ServingCosts.client_placement`)."""
        from planner.simulator.host import stretch_for_loads

        client, router = self.host_load_cores(tokens_per_s, batch)
        bound = (self.router_per_token_s > 0 or self.router_per_step_s > 0) and engine_cores < host_cores
        router_cores = 1 if bound else 0
        other = 1.0 if beside_prompt else 0.0
        return stretch_for_loads(client, router, host_cores, busy_cores=engine_cores + other, router_cores=router_cores,
                                 busy_router_cores=min(other, router_cores), team_cores=engine_cores,
                                 client_placement=client_placement)

    @classmethod
    def of(cls, costs: ServingCosts) -> StreamCpu:
        """The streaming terms a profile's `ServingCosts` hold."""
        return cls(costs.host_cpu_s_per_step, costs.host_cpu_s_per_token, costs.router_cpu_s_per_step,
                   costs.router_cpu_s_per_token)


MIN_WINDOW_STEPS = 16     # a window of fewer steps (a batch whose handoffs were staggered) says too little
MIN_WINDOW_CPU_S = 0.03   # nor one in which the router and the client took under three of /proc's 10 ms ticks


def usable_window(batch: int, window: StreamWindow | None) -> bool:
    """Whether a batched run's window measured enough to fit on: `MIN_WINDOW_STEPS` steps (its tokens
    over its batch) and `MIN_WINDOW_CPU_S` of the unbound processes' CPU."""
    return (window is not None and window.seconds > 0 and window.tokens >= MIN_WINDOW_STEPS * batch
            and window.host_cpu_s >= MIN_WINDOW_CPU_S)


def nonnegative_lstsq(features, target):
    """Plain least squares of `target` on the two columns of `features` with both coefficients >= 0:
    the unconstrained solution where it is, else the better of each column alone. Pure."""
    import numpy as np

    x, y = np.asarray(features, dtype=float), np.asarray(target, dtype=float)
    both, *_ = np.linalg.lstsq(x, y, rcond=None)
    if np.all(both >= 0):
        return both
    best, best_residual = np.zeros(2), float(np.sum(y ** 2))
    for column in range(2):
        norm = float(x[:, column] @ x[:, column])
        coef = np.zeros(2)
        coef[column] = max(0.0, float(x[:, column] @ y) / norm) if norm > 0 else 0.0
        residual = float(np.sum((x @ coef - y) ** 2))
        if residual < best_residual:
            best, best_residual = coef, residual
    return best


def stream_cpu_terms(runs: Sequence[BatchRun], idle_host_cores: float = 0.0, idle_router_cores: float = 0.0,
                     router_cpu_s_per_request: float = 0.0) -> StreamCpu:
    """The unbound CPU per decode step and per token. Over the runs' usable windows (`usable_window`),
    each group's load in cores net of its idle load, the router's and the client's (the host's
    less the router's) apart, is fitted as w * steps/s + t * tokens/s with w, t >= 0
    (`nonnegative_lstsq`; a window's steps are its tokens over its batch: each step streams one
    token a request); the host's terms are the two groups' sums. Where the usable windows cover
    fewer than two batch sizes (an older probe's runs, no window read), per token alone, from the
    largest batch's whole runs (`unbound_cpu_per_token`)."""
    windows = [(run.batch, run.window) for run in runs if usable_window(run.batch, run.window)]
    if len({batch for batch, _ in windows}) < 2:
        host, router = unbound_cpu_per_token(runs, router_cpu_s_per_request) if runs else (0.0, 0.0)
        return StreamCpu(host_per_token_s=host, router_per_token_s=router)
    rates = [[w.tokens / batch / w.seconds, w.tokens / w.seconds] for batch, w in windows]
    router = nonnegative_lstsq(rates, [w.router_cpu_s / w.seconds - idle_router_cores for _, w in windows])
    client = nonnegative_lstsq(rates, [(w.host_cpu_s - w.router_cpu_s) / w.seconds - (idle_host_cores - idle_router_cores)
                                       for _, w in windows])
    return StreamCpu(float(router[0] + client[0]), float(router[1] + client[1]), float(router[0]), float(router[1]))


class NoCommonWindow(RuntimeError):
    """The requests of a batched run never all decoded at once (the first finished before the last
    had its KV): the run measured no step of that batch."""


def common_window(runs: Sequence[Sequence[float]]) -> tuple[float, float, list[float]]:
    """(start, end, gaps): the window in which every request (its token times) is past its handoff
    and none has finished, and the gaps between consecutive tokens inside it. Raises NoCommonWindow
    when it holds fewer gaps than requests."""
    start, end = max(marks[1] for marks in runs), min(marks[-1] for marks in runs)
    gaps = [b - a for marks in runs for a, b in zip(marks, marks[1:]) if a >= start and b <= end]
    if end <= start or len(gaps) < len(runs):
        raise NoCommonWindow(f"the {len(runs)} profiling requests never decoded together (window "
                             f"{max(0.0, end - start):.3f} s)")
    return start, end, gaps


def settled_window(runs: Sequence[Sequence[float]]) -> tuple[float, float, list[float]]:
    """(start, end, gaps): the late half of the `common_window`, where the batch has decoded past
    the handoffs' wake and its context is the longest the run holds, and the gaps inside it.
    Raises NoCommonWindow as that does, or when the half holds fewer gaps than requests."""
    start, end, _ = common_window(runs)
    start = (start + end) / 2
    gaps = [b - a for marks in runs for a, b in zip(marks, marks[1:]) if a >= start and b <= end]
    if len(gaps) < len(runs):
        raise NoCommonWindow(f"the {len(runs)} profiling requests decoded together too briefly to read a settled "
                             f"step ({len(gaps)} gaps in the late half of a {2 * (end - start):.3f} s window)")
    return start, end, gaps


def batch_run_of(batch: int, runs: Sequence[Sequence[float]], host_cpu_s: float = 0.0,
                 router_cpu_s: float = 0.0) -> BatchRun:
    """A batched run from its requests' token times (`runs`, one list per request, in seconds) and
    the unbound processes' CPU over it: the median gap inside the `settled_window`, the batch's
    context at that window's middle (each request's `BATCH_PROMPT_TOKENS` and the tokens it had by
    then) and the tokens per second received inside it, and when that window was. Raises
    NoCommonWindow as that does."""
    start, end, gaps = settled_window(runs)
    inside = sum(1 for marks in runs for t in marks if start <= t <= end)
    generated = statistics.median(sum(1 for t in marks if t <= (start + end) / 2) for marks in runs)
    return BatchRun(batch, statistics.median(gaps), batch * (BATCH_PROMPT_TOKENS + generated),
                    inside / (end - start), host_cpu_s, sum(len(marks) for marks in runs), tuple(gaps), router_cpu_s,
                    start_s=start, end_s=end)


def engine_step_s(batch: int, context_tokens: float, model: PerfModel, measured: Sequence[DecodeSample]) -> float:
    """The engine-only step at `batch` and `context_tokens`: the measured row at the same batch with
    the nearest context, moved along the model's context slope to this context; the model alone
    when no row has this batch."""
    rows = [row for row in measured if row.batch_size == batch]
    if not rows:
        return model.decode_step_s(batch, round(context_tokens))
    row = min(rows, key=lambda r: abs(r.context_tokens - context_tokens))
    return row.step_s + model.decode_step_s(batch, round(context_tokens)) - model.decode_step_s(batch, row.context_tokens)


def fit_served_steps(runs: list[BatchRun], model: PerfModel, host: ServingCosts,
                     router_cpu_s_per_request: float = 0.0, engine_rows: Sequence[DecodeSample] = (),
                     stream: StreamCpu | None = None, engine_cores: float = 1.0,
                     client_placement: str = "router-room") -> tuple[float, float, float]:
    """(decode_step_s, decode_cpu_s_per_token, host_cpu_s_per_token) from batched runs: served
    step / the host's stretch - engine step = a + b * batch, least squares, a and b >= 0 (runs of
    one batch size: b = 0, a their mean). The engine step is `engine_step_s` on `engine_rows` (the
    engine table), the model where none fits.

    The host's CPU per step and per token, and the router's part of them, are `stream`'s (None:
    `stream_cpu_terms` of the runs, with no idle load netted).

    The stretch is the simulator's (`planner.simulator.host`) for one stepping engine over
    `engine_cores` (the decode worker's one: the prefill worker's core, where the router is bound,
    idles; vLLM's server's: every core, `StreamCpu.decode_stretch`) and the host's load at each
    run's token rate, the client placed as `client_placement` says (`ServingCosts.client_placement`,
    which the simulator then charges), so the fitted terms and the simulator's host model do not
    both count the same CPU."""
    import numpy as np

    stream = stream or stream_cpu_terms(runs, router_cpu_s_per_request=router_cpu_s_per_request)
    residuals = served_residuals_s(runs, model, host.host_cores, stream, engine_rows, engine_cores, client_placement)
    batches = np.array([run.batch for run in runs], dtype=float)
    if len(set(batches)) < 2:   # one batch size measured: no slope to fit, all of it per step
        return max(0.0, float(np.mean(residuals))), 0.0, stream.host_per_token_s
    slope, intercept = np.polyfit(batches, np.array(residuals), 1)
    if slope < 0:  # per-token serving cost cannot be negative: the mean residual is all per step
        slope, intercept = 0.0, float(np.mean(residuals))
    return max(0.0, float(intercept)), float(slope), stream.host_per_token_s


def served_residuals_s(runs: Sequence[BatchRun], model: PerfModel, host_cores: int, stream: StreamCpu,
                       engine_rows: Sequence[DecodeSample] = (), engine_cores: float = 1.0,
                       client_placement: str = "router-room") -> list[float]:
    """What serving added to each run's engine step: its served step over the host's stretch (as
    `fit_served_steps` says) minus `engine_step_s`, in seconds (negative where the engine's own
    step measured slower than served: noise)."""
    return [run.step_s / stream.decode_stretch(run.tokens_per_s, run.batch, host_cores, engine_cores, client_placement)
            - engine_step_s(run.batch, run.context_tokens, model, engine_rows) for run in runs]


# Two batched runs of one batch whose steps differ by more than this (the slower over the faster)
# are not one measurement: the profile runs that batch once more and fits the run of the median
# step of the three (`median_runs`), not the mean of two that disagree. On an AMX Xeon the two runs at batch 64 took 16.0 and
# 10.6 ms a step, and the validation's steps at that batch, the host's share taken out, 14.5 ms.
SECOND_LOOK_SPREAD = 0.10


def batches_to_measure_again(runs: Sequence[BatchRun], spread: float = SECOND_LOOK_SPREAD) -> list[int]:
    """The batches, ascending, with at least two runs but fewer than three whose steps differ by
    more than `spread` (the slowest's step over the fastest's, minus 1): a probe that runs each
    batch three times or more (vLLM's server's: four) has its median already. Pure."""
    by_batch: dict[int, list[float]] = {}
    for run in runs:
        by_batch.setdefault(run.batch, []).append(run.step_s)
    return [batch for batch, steps in sorted(by_batch.items())
            if 2 <= len(steps) < 3 and min(steps) > 0 and max(steps) / min(steps) - 1 > spread]


def median_runs(runs: Sequence[BatchRun], batches: Sequence[int]) -> list[BatchRun]:
    """`runs` in their order, each batch of `batches` with an odd number of runs (three: measured
    again, `batches_to_measure_again`) left with its run of the median step alone; other batches'
    runs, and a batch whose extra run failed (two: no tie broken), as they are. Pure."""
    chosen: dict[int, BatchRun] = {}
    for batch in set(batches):
        of_batch = sorted((run for run in runs if run.batch == batch), key=lambda run: run.step_s)
        if len(of_batch) % 2 == 1:
            chosen[batch] = of_batch[len(of_batch) // 2]
    return [run for run in runs if run.batch not in chosen or run is chosen[run.batch]]


def served_extra_by_batch(batches: Sequence[float], residuals_s: Sequence[float]) -> tuple[tuple[float, float], ...]:
    """`ServingCosts.served_step_extra_s` from each run's batch and residual (`served_residuals_s`):
    per batch, the median of its runs' residuals, at least 0, in ascending batch. Pure."""
    if len(batches) != len(residuals_s):
        raise ValueError(f"{len(batches)} batches but {len(residuals_s)} residuals")
    by_batch: dict[float, list[float]] = {}
    for batch, residual in zip(batches, residuals_s):
        by_batch.setdefault(float(batch), []).append(residual)
    return tuple((batch, max(0.0, statistics.median(values))) for batch, values in sorted(by_batch.items()))


def served_step_error(runs: Sequence[BatchRun], model: PerfModel, costs: ServingCosts, by_batch: bool,
                      engine_rows: Sequence[DecodeSample] = (), engine_cores: float = 1.0) -> float:
    """The mean |error| of what `costs` charge for each run's served step (its engine step plus
    `ServingCosts.decode_serving_s`, by batch or the line, stretched as `fit_served_steps`
    stretches it) against the step measured: that form's fit error."""
    stream = StreamCpu.of(costs)
    errors = [abs((engine_step_s(run.batch, run.context_tokens, model, engine_rows)
                   + costs.decode_serving_s(run.batch, by_batch))
                  * stream.decode_stretch(run.tokens_per_s, run.batch, costs.host_cores, engine_cores,
                                          costs.client_placement) / run.step_s - 1)
              for run in runs]
    return statistics.mean(errors) if errors else 0.0


def unbound_cpu_per_token(runs: Sequence[BatchRun], router_cpu_s_per_request: float) -> tuple[float, float]:
    """(host, router) CPU seconds per token streamed, from the largest batch's runs (medians),
    each net of the router's per-request share: the batched runs' client sends token ids and does
    next to nothing per request, unlike the load generator whose per-request cost
    `host_cpu_s_per_request` also holds. The router's part is at most the host's."""
    largest = [run for run in runs if run.batch == max(r.batch for r in runs)]
    host = max(0.0, statistics.median((run.host_cpu_s - run.batch * router_cpu_s_per_request) / run.tokens
                                      for run in largest))
    router = max(0.0, statistics.median((run.router_cpu_s - run.batch * router_cpu_s_per_request) / run.tokens
                                        for run in largest))
    return host, min(host, router)


@dataclass(frozen=True)
class ServedSteps:
    """The served decode step's terms (`fit_served_steps`), its spread (`planner.profiler.spread`)
    and the runs they were fitted on, as the profile keeps them (`kept_row`)."""

    decode_step_s: float
    decode_cpu_s_per_token: float
    host_cpu_s_per_token: float
    spread_s: tuple[float, ...] = ()
    router_cpu_s_per_token: float = 0.0  # the router's part of host_cpu_s_per_token
    host_cpu_s_per_step: float = 0.0     # per decode step that streams (`stream_cpu_terms`)
    router_cpu_s_per_step: float = 0.0   # the router's part of it
    batch_runs: tuple[tuple[float, float, float, float], ...] = ()
    extra_by_batch: tuple[tuple[float, float], ...] = ()  # `served_extra_by_batch`
    batch_windows_s: tuple[tuple[float, float], ...] = ()  # `kept_window` of each of batch_runs


def batch_output_attempts(max_output_tokens: int, attempts: int = 3) -> list[int]:
    """The output lengths a batched run tries: BATCH_OUTPUT_TOKENS, then doubled, within the context."""
    lengths = [BATCH_OUTPUT_TOKENS * 2 ** i for i in range(attempts)]
    return [n for n in lengths if n <= max_output_tokens] or [max(2, max_output_tokens)]
