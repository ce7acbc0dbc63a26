"""The pure half of the serving probe (`planner.profiler.serving_probe`, which measures): the plan of
its runs and the fits of its CPU runs into `ServingCosts`' per-request terms; the batched runs'
fits (the served decode step, the CPU per step and per token streamed) are
`planner.profiler.stream_fit`'s. No I/O here: every function takes plain values (token times, CPU
seconds, the engine-only model) and is tested so.

The forms fitted (the probe's module doc says how each input is measured): per group of processes,
cpu = a * requests + b * tokens through two steady runs (`solve_per_request_and_token`), and
+ c * prompt tokens through a third whose prompts are long (`solve_per_prompt_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.perf_model import PerfModel
from planner.profiler.plan import QUICK_BATCHES as QUICK_ENGINE_BATCHES
from planner.profiler.stream_fit import BATCH_OUTPUT_TOKENS, BATCH_PROMPT_TOKENS
from planner.serving_costs import ServingCosts

SHORT_OUTPUT, LONG_OUTPUT = 2, 32
# decode batch sizes the served steps are fitted on, each run BATCH_REPEATS times (one run is noisy);
# batch sizes and prompts the engine table measures too (`planner.profiler.plan`)
BATCHES, QUICK_BATCHES, BATCH_REPEATS = (1, 4, 8, 16, 32, 64), QUICK_ENGINE_BATCHES, 2
# requests of each CPU run: a quick plan's (tests, smoke runs) read its terms to a few ms a request
# of /proc's 10 ms ticks and takes half a minute less than at 24 (4 runs of ~7 s at the tiny model's
# rate on a Zen 3 EPYC); the full plan's to a fraction of a millisecond
LOAD_REQUESTS, QUICK_LOAD_REQUESTS = 60, 12
# streams decoding beside the prompt-loss probes (`prompt_loss_probe`): one row each, the lower
# ends of the "2-3", "8-15" and "32-63" buckets of `planner.validation_steps.BATCH_BUCKETS`
PROMPT_LOSS_BATCHES = (2, 8, 32)
# a quick plan's (tests, smoke runs): one level of streams beside idle (the quick profile 184 ->
# 174 s on a Zen 3 EPYC)
QUICK_PROMPT_LOSS_BATCHES = (8,)


@dataclass(frozen=True)
class ServingPlan:
    prompt_tokens: tuple[int, ...]   # lone requests for the latencies
    repeats: int
    load_prompt_tokens: int          # the CPU runs' prompts
    load_requests: int               # per CPU run
    decode_batches: tuple[int, ...]  # batch sizes of the served-step runs, in run order (repeats included)
    max_output_tokens: int = 4 * BATCH_OUTPUT_TOKENS  # the longest output a batched run may ask (the context)
    long_prompt_tokens: int = 0      # the long-prompt CPU run's prompts (0: no such run, nor its reference)
    prompt_loss_batches: tuple[int, ...] = ()   # streams beside the prompt-loss probes (0 first: idle)
    prompt_loss_repeats: int = 0                # of each probe length at each of those

    @property
    def steps(self) -> int:
        """Progress steps of the lone requests, the CPU runs and the batched runs (what
        `measure_serving` and `vllm_server_probe` both report)."""
        return 3 + 2 * bool(self.long_prompt_tokens) + len(self.prompt_tokens) + len(self.decode_batches)

    @property
    def cluster_steps(self) -> int:
        """`measure_serving`'s: `steps` and the prompt-loss probes'."""
        return self.steps + len(self.prompt_loss_batches)

    @property
    def prompt_loss_lengths(self) -> tuple[int, ...]:
        """The prompt-loss probes' lengths: the lone requests' and the long one, ascending."""
        return tuple(sorted({*self.prompt_tokens, *((self.long_prompt_tokens,) if self.long_prompt_tokens else ())}))


def serving_plan(max_model_len: int, max_num_seqs: int, quick: bool,
                 batch_repeats: int = BATCH_REPEATS) -> ServingPlan:
    """The runs of a serving probe; `batch_repeats` runs of each batch size (one with `quick`)."""
    prompts = tuple(n for n in (32, 128, 512) if n + LONG_OUTPUT < max_model_len) or (max_model_len // 4,)
    sizes = sorted({min(b, max_num_seqs) for b in (QUICK_BATCHES if quick else BATCHES)})
    batches = tuple(sizes) if quick else tuple(sizes) * batch_repeats
    load_prompt = min(128, max_model_len // 4)
    return ServingPlan(prompts, 3 if quick else 6, load_prompt, QUICK_LOAD_REQUESTS if quick else LOAD_REQUESTS, batches,
                       max_output_tokens=max_model_len - BATCH_PROMPT_TOKENS,
                       long_prompt_tokens=long_prompt_tokens(load_prompt, max_model_len),
                       prompt_loss_batches=(0, *(b for b in (QUICK_PROMPT_LOSS_BATCHES if quick else PROMPT_LOSS_BATCHES)
                                                 if b < max_num_seqs)),
                       prompt_loss_repeats=2 if quick else 3)


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


def solve_per_prompt_token(short: CpuRun, long_prompts: CpuRun, group: str, per_token: float,
                           reference: CpuRun | None = None) -> tuple[float, float]:
    """(a, c) of cpu = a * requests + per_token * tokens + c * prompt tokens: c through `reference`
    (short prompts at `long_prompts`' rate and count, None: `short` itself) and `long_prompts`
    (longer prompts; clamped at 0: noise), a through `short` (the run that gave `per_token`). With
    c 0 the per-request term is the short run's alone, as `solve_per_request_and_token` gives it.

    The reference matters: a long-prompt run goes at a lower rate than `short`, so what a request
    costs at that rate apart from its prompt (its wake-ups, and the idle load netted over a longer
    run) differs too, and read against `short` it can hide the prompt's cost or double it; against
    short prompts at the same rate and count it cancels."""
    base = reference if reference is not None else short
    mean_base = base.prompt_tokens / base.requests
    d_prompt = long_prompts.prompt_tokens / long_prompts.requests - mean_base
    if d_prompt <= 0:
        raise ValueError("the long-prompt run's prompts must be longer on average than the short run's")
    base_each, long_each = ((run.cpu_s[group] - per_token * run.tokens) / run.requests for run in (base, long_prompts))
    per_prompt_token = max(0.0, (long_each - base_each) / d_prompt)
    short_each = (short.cpu_s[group] - per_token * short.tokens) / short.requests
    return max(0.0, short_each - per_prompt_token * short.prompt_tokens / short.requests), per_prompt_token


def long_prompt_requests(rate_rps: float, most: int) -> int:
    """Requests of the long-prompt CPU run (and of its reference): LONG_PROMPT_RUN_S of them at
    `rate_rps`, at least MIN_LONG_PROMPT_REQUESTS, at most `most` (the other runs' count)."""
    return min(most, max(MIN_LONG_PROMPT_REQUESTS, round(rate_rps * LONG_PROMPT_RUN_S)))


# /proc counts CPU in 10 ms ticks: a group's difference between two runs is good to about 20 ms,
# which over 24 requests of 1k prompts is 0.9 us a prompt token, about what a worker's prompt
# costs it (0.5-1.3 us on a Zen 4 EPYC, `bench/prompt_cpu.py`); over 48, half that
LONG_PROMPT_RUN_S, MIN_LONG_PROMPT_REQUESTS = 40.0, 30


def cpu_terms(short: CpuRun, long: CpuRun, long_prompts: CpuRun | None, host_cores: int,
              reference: CpuRun | None = None) -> ServingCosts:
    """`ServingCosts`' CPU terms from the steady runs (groups decode, prefill, host, router; a
    group the runs did not read stays 0, as vLLM's server has no workers apart): per request and
    output token from `short` and `long` (same prompts, outputs apart), per prompt token from
    `long_prompts` against `reference`, short prompts at its rate and count (None: against `short`;
    no `long_prompts`: 0; `solve_per_prompt_token`). The prefill worker streams no output, so
    its terms come from both short-prompt runs pooled. The router's are at most the host's, of
    which they are part, whatever the noise."""
    terms = {group: (0.0, 0.0) for group in ("decode", "host", "router")}
    for group in (group for group in terms if group in short.cpu_s):
        per_request, per_token = solve_per_request_and_token(short, long, group)
        per_prompt_token = 0.0
        if long_prompts is not None:
            per_request, per_prompt_token = solve_per_prompt_token(short, long_prompts, group, per_token, reference)
        terms[group] = (per_request, per_prompt_token)
    prefill = (0.0, 0.0)
    if "prefill" in short.cpu_s:
        pooled = CpuRun(short.requests + long.requests, short.tokens + long.tokens,
                        {"prefill": short.cpu_s["prefill"] + long.cpu_s["prefill"]},
                        prompt_tokens=short.prompt_tokens + long.prompt_tokens)
        prefill = ((pooled.cpu_s["prefill"] / pooled.requests, 0.0) if long_prompts is None
                   else solve_per_prompt_token(pooled, long_prompts, "prefill", 0.0, reference))
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
    way_in_s: float | None = None  # the Decode call's way in, traced (None: no trace read)


def split_lone_handoff(handoff_s: float, way_in_s: float | None) -> tuple[float, float]:
    """(`ServingCosts.handoff_s`, `idle_join_s`) from a lone request's handoff net of what the
    simulator charges an idle decode engine (its pull and its join step, the request's CPU) and,
    where the trace measured it, the Decode call's way in: the way in is the hop, the rest what
    the idle engine took beyond the simulator's charge. Untraced, all of it is the hop, as in a
    profile measured before. Pure."""
    if way_in_s is None:
        return max(0.0, handoff_s), 0.0
    return max(0.0, way_in_s), max(0.0, handoff_s - max(0.0, way_in_s))


def steady_rate(model: PerfModel, prompt_tokens: int) -> float:
    """A request rate that keeps both engines about a third busy at the CPU runs' long outputs, at
    most `MAX_STEADY_RATE_RPS` (a model that charges next to nothing, a test's, would ask any)."""
    per_request_s = max(model.prefill_s(prompt_tokens, prompt_tokens),
                        LONG_OUTPUT * model.decode_step_s(1, prompt_tokens))
    return min(MAX_STEADY_RATE_RPS, 0.3 / per_request_s) if per_request_s > 0 else MAX_STEADY_RATE_RPS


MAX_STEADY_RATE_RPS = 10.0
