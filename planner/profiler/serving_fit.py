"""The pure half of the serving probe (`planner.profiler.serving_probe`, which measures): the plan of
its runs and the fits that turn what they measured into `ServingCosts` terms. No I/O here: every
function takes plain values (token times, CPU seconds, the engine-only model) and is tested so.

The forms fitted (the probe's module doc says how each input is measured):
- per group of processes, cpu = a * requests + b * tokens through two steady runs
  (`solve_per_request_and_token`), and + c * prompt tokens through a third whose prompts are
  long (`solve_per_prompt_token`);
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
from planner.profile import DecodeSample, ServingCosts
from planner.profiler.plan import QUICK_BATCHES as QUICK_ENGINE_BATCHES
from planner.profiler.plan import SHORT_CONTEXT

SHORT_OUTPUT, LONG_OUTPUT = 2, 32
# decode batch sizes the served steps are fitted on, each run BATCH_REPEATS times (one run is noisy);
# batch sizes and prompts the engine table measures too (`planner.profiler.plan`)
BATCHES, QUICK_BATCHES, BATCH_REPEATS = (1, 4, 8, 16, 32, 64), QUICK_ENGINE_BATCHES, 2
# A batched run's outputs are long enough that its steps are read where the batch has settled and
# its context is what served requests decode at: over the late half of the window in which all
# decode together (`settled_window`), 100-250 tokens of context a sequence. Read over all of a
# 64-token window (16-48 tokens a sequence), the served step's cost per sequence came out 262 us on
# the Zen 3 EPYC where streams that kept decoding measured 155-170, and the simulator over-charged
# the decodes of a loaded cluster by 20-30% (BENCHMARKS, "Across shapes on an AVX2-only EPYC").
BATCH_PROMPT_TOKENS, BATCH_OUTPUT_TOKENS = SHORT_CONTEXT, 256


@dataclass(frozen=True)
class ServingPlan:
    prompt_tokens: tuple[int, ...]   # lone requests for the latencies
    repeats: int
    load_prompt_tokens: int          # the CPU runs' prompts
    load_requests: int               # per CPU run
    decode_batches: tuple[int, ...]  # batch sizes of the served-step runs, in run order (repeats included)
    max_output_tokens: int = 4 * BATCH_OUTPUT_TOKENS  # the longest output a batched run may ask (the context)
    long_prompt_tokens: int = 0      # the third CPU run's prompts (0: no such run)

    @property
    def steps(self) -> int:
        """Progress steps `measure_serving` reports."""
        return 3 + bool(self.long_prompt_tokens) + len(self.prompt_tokens) + len(self.decode_batches)


def serving_plan(max_model_len: int, max_num_seqs: int, quick: bool,
                 batch_repeats: int = BATCH_REPEATS) -> ServingPlan:
    """The runs of a serving probe; `batch_repeats` runs of each batch size (one with `quick`)."""
    prompts = tuple(n for n in (32, 128, 512) if n + LONG_OUTPUT < max_model_len) or (max_model_len // 4,)
    sizes = sorted({min(b, max_num_seqs) for b in (QUICK_BATCHES if quick else BATCHES)})
    batches = tuple(sizes) if quick else tuple(sizes) * batch_repeats
    load_prompt = min(128, max_model_len // 4)
    return ServingPlan(prompts, 3 if quick else 6, load_prompt, 24 if quick else 60, batches,
                       max_output_tokens=max_model_len - BATCH_PROMPT_TOKENS,
                       long_prompt_tokens=long_prompt_tokens(load_prompt, max_model_len))


def long_prompt_tokens(load_prompt_tokens: int, max_model_len: int) -> int:
    """The long-prompt CPU run's mean prompt: half the context (its prompts reach 2/3 of it at the
    workload's spread), and 0 (no run) where that is not 4x the other runs' prompts, too close to
    tell a per-token cost from noise."""
    tokens = max_model_len // 2
    return tokens if tokens >= 4 * load_prompt_tokens else 0


@dataclass(frozen=True)
class CpuRun:
    requests: int
    tokens: int              # output tokens streamed
    cpu_s: dict[str, float]  # group -> CPU seconds over the run
    wall_s: float = 0.0      # the run's length
    prompt_tokens: int = 0   # the requests' prompt tokens

    def net_of_idle(self, idle_cores: dict[str, float]) -> CpuRun:
        """This run's CPU without what each group uses idle (`idle_cores` x the run's length),
        at least 0."""
        return CpuRun(self.requests, self.tokens,
                      {group: max(0.0, cpu - idle_cores.get(group, 0.0) * self.wall_s)
                       for group, cpu in self.cpu_s.items()}, self.wall_s, self.prompt_tokens)


def solve_per_request_and_token(short: CpuRun, long: CpuRun, group: str) -> tuple[float, float]:
    """(a, b) of cpu = a*requests + b*tokens through the two runs, clamped at 0 (noise)."""
    d_tokens = long.tokens - short.tokens
    if d_tokens <= 0:
        raise ValueError("the long-output run must stream more tokens than the short one")
    per_token = max(0.0, (long.cpu_s[group] - short.cpu_s[group]) / d_tokens)
    per_request = max(0.0, (short.cpu_s[group] - per_token * short.tokens) / short.requests)
    return per_request, per_token


def solve_per_prompt_token(short: CpuRun, long_prompts: CpuRun, group: str, per_token: float) -> tuple[float, float]:
    """(a, c) of cpu = a * requests + per_token * tokens + c * prompt tokens through `short` (the
    run that gave `per_token`) and `long_prompts` (longer prompts, clamped at 0: noise). With c
    0 the per-request term is the short run's alone, as `solve_per_request_and_token` gives it."""
    mean_short = short.prompt_tokens / short.requests
    d_prompt = long_prompts.prompt_tokens / long_prompts.requests - mean_short
    if d_prompt <= 0:
        raise ValueError("the long-prompt run's prompts must be longer on average than the short run's")
    short_each, long_each = ((run.cpu_s[group] - per_token * run.tokens) / run.requests for run in (short, long_prompts))
    per_prompt_token = max(0.0, (long_each - short_each) / d_prompt)
    return max(0.0, short_each - per_prompt_token * mean_short), per_prompt_token


def long_prompt_requests(rate_rps: float, most: int) -> int:
    """Requests of the long-prompt CPU run: LONG_PROMPT_RUN_S of them at `rate_rps`, at least
    MIN_LONG_PROMPT_REQUESTS, at most `most` (the other runs' count)."""
    return max(MIN_LONG_PROMPT_REQUESTS, min(most, round(rate_rps * LONG_PROMPT_RUN_S)))


LONG_PROMPT_RUN_S, MIN_LONG_PROMPT_REQUESTS = 20.0, 16


def cpu_terms(short: CpuRun, long: CpuRun, long_prompts: CpuRun | None, host_cores: int) -> ServingCosts:
    """`ServingCosts`' CPU terms from the steady runs (groups decode, prefill, host, router; a
    group the runs did not read stays 0, as vLLM's server has no workers apart): per request and
    output token from `short` and `long` (same prompts, outputs apart), per prompt token from
    `long_prompts` against `short` (None: no such run, 0). The prefill worker streams no output, so
    its terms come from both short-prompt runs pooled. The router's are at most the host's, of
    which they are part, whatever the noise."""
    terms = {group: (0.0, 0.0) for group in ("decode", "host", "router")}
    for group in (group for group in terms if group in short.cpu_s):
        per_request, per_token = solve_per_request_and_token(short, long, group)
        per_prompt_token = 0.0
        if long_prompts is not None:
            per_request, per_prompt_token = solve_per_prompt_token(short, long_prompts, group, per_token)
        terms[group] = (per_request, per_prompt_token)
    prefill = (0.0, 0.0)
    if "prefill" in short.cpu_s:
        pooled = CpuRun(short.requests + long.requests, short.tokens + long.tokens,
                        {"prefill": short.cpu_s["prefill"] + long.cpu_s["prefill"]},
                        prompt_tokens=short.prompt_tokens + long.prompt_tokens)
        prefill = ((pooled.cpu_s["prefill"] / pooled.requests, 0.0) if long_prompts is None
                   else solve_per_prompt_token(pooled, long_prompts, "prefill", per_token=0.0))
    router = tuple(min(r, h) for r, h in zip(terms["router"], terms["host"]))
    return ServingCosts(decode_cpu_s_per_request=terms["decode"][0], decode_cpu_s_per_prompt_token=terms["decode"][1],
                        prefill_cpu_s_per_request=prefill[0], prefill_cpu_s_per_prompt_token=prefill[1],
                        host_cpu_s_per_request=terms["host"][0], host_cpu_s_per_prompt_token=terms["host"][1],
                        router_cpu_s_per_request=router[0], router_cpu_s_per_prompt_token=router[1],
                        host_cores=host_cores)


@dataclass(frozen=True)
class LoneLatencies:
    """Medians over lone requests of what the client saw beyond the engine-only model, and the
    first token's spread around its median (`planner.profiler.spread`)."""

    first_token_s: float
    handoff_s: float
    first_token_spread_s: tuple[float, ...] = ()


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

    def decode_stretch(self, tokens_per_s: float, batch: float, host_cores: float, engine_cores: float = 1.0) -> float:
        """How much longer than its engine time a decode step takes while `batch` streams get
        `tokens_per_s` and nothing else steps: the simulator's host model (`planner.simulator.host`)
        for the one stepping engine, over `engine_cores` of the host's cores. Where it leaves a core
        (a cluster's decode worker), the router is bound to the idle prefill core where it is
        measured apart; an engine over every core (vLLM's server) leaves none, and its front end
        floats and holds the whole step (the team stretch), as the simulator charges it."""
        from planner.simulator.host import stretch_for_loads

        client, router = self.host_load_cores(tokens_per_s, batch)
        bound = (self.router_per_token_s > 0 or self.router_per_step_s > 0) and engine_cores < host_cores
        return stretch_for_loads(client, router, host_cores, busy_cores=engine_cores, router_cores=1 if bound else 0,
                                 team_cores=engine_cores)

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
    then) and the tokens per second received inside it. Raises NoCommonWindow as that does."""
    start, end, gaps = settled_window(runs)
    inside = sum(1 for marks in runs for t in marks if start <= t <= end)
    generated = statistics.median(sum(1 for t in marks if t <= (start + end) / 2) for marks in runs)
    return BatchRun(batch, statistics.median(gaps), batch * (BATCH_PROMPT_TOKENS + generated),
                    inside / (end - start), host_cpu_s, sum(len(marks) for marks in runs), tuple(gaps), router_cpu_s)


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
                     stream: StreamCpu | None = None, engine_cores: float = 1.0) -> tuple[float, float, float]:
    """(decode_step_s, decode_cpu_s_per_token, host_cpu_s_per_token) from batched runs: served
    step / the host's stretch - engine step = a + b * batch, least squares, a and b >= 0 (runs of
    one batch size: b = 0, a their mean). The engine step is `engine_step_s` on `engine_rows` (the
    engine table), the model where none fits.

    The host's CPU per step and per token, and the router's part of them, are `stream`'s (None:
    `stream_cpu_terms` of the runs, with no idle load netted).

    The stretch is the simulator's (`planner.simulator.host`) for one stepping engine over
    `engine_cores` (the decode worker's one: the prefill worker's core, where the router is bound,
    idles; vLLM's server's: every core, `StreamCpu.decode_stretch`) and the host's load at each
    run's token rate, so the fitted terms and the simulator's host model do not both count the same
    CPU."""
    import numpy as np

    stream = stream or stream_cpu_terms(runs, router_cpu_s_per_request=router_cpu_s_per_request)
    residuals = [run.step_s / stream.decode_stretch(run.tokens_per_s, run.batch, host.host_cores, engine_cores)
                 - engine_step_s(run.batch, run.context_tokens, model, engine_rows) for run in runs]
    batches = np.array([run.batch for run in runs], dtype=float)
    if len(set(batches)) < 2:   # one batch size measured: no slope to fit, all of it per step
        return max(0.0, float(np.mean(residuals))), 0.0, stream.host_per_token_s
    slope, intercept = np.polyfit(batches, np.array(residuals), 1)
    if slope < 0:  # per-token serving cost cannot be negative: the mean residual is all per step
        slope, intercept = 0.0, float(np.mean(residuals))
    return max(0.0, float(intercept)), float(slope), stream.host_per_token_s


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


def steady_rate(model: PerfModel, prompt_tokens: int) -> float:
    """A request rate that keeps both engines about a third busy at the CPU runs' long outputs, at
    most `MAX_STEADY_RATE_RPS` (a model that charges next to nothing, a test's, would ask any)."""
    per_request_s = max(model.prefill_s(prompt_tokens, prompt_tokens),
                        LONG_OUTPUT * model.decode_step_s(1, prompt_tokens))
    return min(MAX_STEADY_RATE_RPS, 0.3 / per_request_s) if per_request_s > 0 else MAX_STEADY_RATE_RPS


MAX_STEADY_RATE_RPS = 10.0


@dataclass(frozen=True)
class ServedSteps:
    """The served decode step's terms (`fit_served_steps`) and its spread (`planner.profiler.spread`)."""

    decode_step_s: float
    decode_cpu_s_per_token: float
    host_cpu_s_per_token: float
    spread_s: tuple[float, ...] = ()
    router_cpu_s_per_token: float = 0.0  # the router's part of host_cpu_s_per_token
    host_cpu_s_per_step: float = 0.0     # per decode step that streams (`stream_cpu_terms`)
    router_cpu_s_per_step: float = 0.0   # the router's part of it


def batch_output_attempts(max_output_tokens: int, attempts: int = 3) -> list[int]:
    """The output lengths a batched run tries: BATCH_OUTPUT_TOKENS, then doubled, within the context."""
    lengths = [BATCH_OUTPUT_TOKENS * 2 ** i for i in range(attempts)]
    return [n for n in lengths if n <= max_output_tokens] or [max(2, max_output_tokens)]
