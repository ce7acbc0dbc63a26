"""What serving adds around the engines (`planner.serving_costs.ServingCosts`), measured on a real
1P+1D local cluster against an engine-only fit of the same engine settings.

- Latencies, from lone requests sent one at a time, `LONE_PAUSE_S` apart (nothing queues, and the
  workers have gone idle in between): what the client sees beyond what the engine-only model
  predicts.
    first_token_s = TTFT - prefill(n)
    handoff_s     = (second token - first token) - KV transfer(n) - decode step(1, n + 1)
  Medians over a few prompt lengths and repeats. The cluster's engines run with the step trace
  (`pdserve.engine_step_trace`), which times the Decode call's way in apart (the prefill engine's
  step to the decode worker's front end, `planner.validation_joins.hop_in_s`): that is kept as
  `handoff_s`, and the rest of the handoff as `idle_join_s`, what a decode engine woken from idle
  takes beyond the pull and the step the simulator charges (`serving_fit.split_lone_handoff`).
- CPU, from two steady Poisson runs at the same request rate, one with short and one with long
  outputs, and two more at a lower rate with short outputs: prompts of half the context
  (`serving_fit.long_prompt_tokens`) and, at the same rate and count, the short prompts again (the
  reference those are read against). The CPU seconds each group of processes took (from /proc)
  over each run solve cpu = a * requests + b * tokens (+ c * prompt tokens, the long prompts
  against their reference) per group (`serving_fit.cpu_terms`):
    the decode worker's API process (gRPC, handler)  -> decode_cpu_s_per_request
      and its KV pulls' threads (`kv_transfer.threads.KV_THREAD_PREFIX`)
    the prefill worker's API process                 -> prefill_cpu_s_per_request
      and its KV server's threads
    the router and this process (the client)         -> host_cpu_s_per_request
    the router alone                                 -> router_cpu_s_per_request (its part of the
                                                        above), netted out of the batches below
  Each group's CPU while the cluster sits idle (heartbeats, timers, the progress bar) is netted
  out of both runs first: it is not work the traffic brings, and at a slow model's low profiling
  rate it would read as tens of ms per request (43 ms per request of "router and client" CPU on
  `bench`, 9 ms on `tiny`, for the same Python). It is measured with no request for a tenth of a
  run's expected length (`MIN_IDLE_S` to `MAX_IDLE_S`), long enough that /proc's 10 ms ticks,
  scaled up to the run, stay small per request.
  The KV connector's threads run in the engine's process, on its core, and no engine table holds
  them: on a Zen 4 EPYC a 1.4k-token prompt's pull took 1.4 ms of CPU in the decode worker's threads
  and 1.3 ms in the prefill worker's KV server, against 0.4-0.6 ms for a 128-token prompt's
  (`bench/prompt_cpu.py`; BENCHMARKS, "What a long prompt costs the workers' cores").
  Not counted: vLLM's engine core and model runner. The engine tables were measured through
  vLLM's own AsyncLLM, engine core and model runner, so their work is in the tables already;
  and both poll each other with sched_yield for up to --vllm-spin-ms after each message, CPU time
  that /proc counts but that yields to any other runnable thread, so it would read as load that
  is not there.
- Decode steps as served (`planner.profiler.batched_runs`), from batches of B requests sent at once (B in `BATCHES`): the median
  gap between tokens over the late half of the window in which all B decode together
  (`stream_fit.settled_window`: past the handoffs, at the longest context the run holds), net of
  the engine-only step and of the host's stretch, is kept at each B (`served_step_extra_s`: the
  median of B's runs, which the simulator interpolates) and fitted as served(B) - engine(B) =
  decode_step_s + decode_cpu_s_per_token * B (the router's linear cost model's form; a line through
  it misses its own runs by -10..+31% on an AMX Xeon: a fixed part at small B, then a steeper rise
  as the router's core fills). engine(B) is the engine table's own row at batch B and the same
  short prompts (`plan.SHORT_CONTEXT`), not
  the fit: where the fit misses the engine, the miss would be read as serving cost and then
  charged again on top of the fit at every other context (on `bench` it tripled the per-token
  cost). Per token cost is not what a lone request shows: a step's outputs wake the API process,
  the router and the client once for the whole batch, so at batch 1 the wake-ups look like
  per-token cost and a model built on them saturates at a fraction of the rate the cluster serves.
  The host's CPU (router and client) and the router's part of it are read when the last request of
  a batched run has its second token and when the first ends (`StreamWindow`: only streaming in
  between, no request's admission or handoff), and fitted over every batch as a cost per decode
  step that streams (the outputs' wake-up) and per token (`host_cpu_s_per_step`, `host_cpu_s_per_token`,
  the router's `router_cpu_s_per_*`; `stream_fit.stream_cpu_terms`), net of each group's idle load.
  (Before, per token alone from the largest batch's whole runs net of the router's per-request
  share: on the slow Zen 4 EPYC that read 85 us a token for the router where it took 230 us and
  0.5 ms a step streaming, a third of what the prefill core lost to it at batch 4-16.)
- A request's first decode steps, from `WARMUP_REPEATS` lone requests of `WARMUP_OUTPUT` tokens at
  each of two prompt lengths (the CPU runs' and the long prompts'), one at a time, read off the
  decode engine's trace: what their steps after the join took over each request's own steady
  step, fitted against the context (`join_warmup`: `join_warmup_s`, `join_warmup_s_per_context_token`).
- The latencies are then net of the CPU terms the simulator charges on the same path (the
  prefill worker's per request on the first token; the decode worker's per request and one
  step's cost on the handoff), so nothing is counted twice.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from kv_transfer.threads import KV_THREAD_PREFIX
from loadgen.proc_cpu import cpu_seconds, named_threads_cpu_s, process_tree
from pdserve.engine import EngineSettings
from planner.perf_model import PerfModel
from planner.profile import DecodeSample
from planner.profiler.serving_fit import (LONG_OUTPUT, SHORT_OUTPUT, CpuRun, LoneLatencies, ServingPlan, cpu_terms,
                                          long_prompt_requests, serving_plan, split_lone_handoff, steady_rate)
from planner.profiler.spread import spread_of
from planner.profiler.batched_runs import BROKEN_CONNECTION, UnboundCpu, host_cpu_seconds, measure_served_steps
from planner.profiler.stream_fit import BATCH_PROMPT_TOKENS
from planner.serving_costs import MEASURED_CLIENT_PLACEMENT, ServingCosts

LONE_OUTPUT = 3  # tokens of each lone request: the first and the handoff


WARMUP_REPEATS = 4   # lone requests at each length whose first decode steps are read (`measure_join_warmup`)
WARMUP_OUTPUT = 40   # tokens each: the join, the steps it warms up and a steady stretch after them

LONE_PAUSE_S = 0.2  # between lone requests: past vLLM's polling, so each finds the workers idle as
                    # a request arriving at a moderate rate does, not still spinning from the last


MIN_IDLE_S, MAX_IDLE_S = 3.0, 20.0  # bounds of the window without traffic where idle CPU is measured


async def token_times(client, ids: list[int], max_tokens: int) -> list[float]:
    """When each token of a greedy, `ignore_eos` request for `ids` reached this process."""
    marks: list[float] = []
    async for chunk in client.generate(token_ids=ids, max_tokens=max_tokens, ignore_eos=True, temperature=0.0):
        marks += [time.perf_counter()] * len(chunk.token_ids)
    return marks


async def lone_runs(stream, plan: ServingPlan, vocab_size: int, advance,
                    label: str = "serving") -> list[tuple[int, float, list[float]]]:
    """Every lone request of `plan` (`plan.repeats` per prompt length, `LONE_PAUSE_S` apart, random
    ids, `LONE_OUTPUT` tokens) sent through `stream(ids, max_tokens)`, which returns its token times:
    (prompt tokens, when it was sent, its token times) each, in order."""
    import numpy as np

    rng, runs = np.random.default_rng(7), []
    for n in plan.prompt_tokens:
        for _ in range(plan.repeats):
            await asyncio.sleep(LONE_PAUSE_S)
            ids = [int(i) for i in rng.integers(10, vocab_size, size=n)]
            started = time.perf_counter()
            runs.append((n, started, await stream(ids, LONE_OUTPUT)))
        advance(f"{label}: lone {n}-token requests")
    return runs


async def lone_request_latencies(target: str, model: PerfModel, kv_bytes_per_token: int, block_size: int,
                                 transport: str, plan: ServingPlan, vocab_size: int, advance,
                                 way_in_s: Callable[[float, float], float | None] = lambda start_s, end_s: None
                                 ) -> LoneLatencies:
    """The lone requests' latencies; `way_in_s(start_s, end_s)` reads the Decode calls' way in of
    the requests sent in that window (monotonic seconds) from the engines' trace."""
    from pdserve.client import AsyncClient

    start_s = time.perf_counter()
    async with AsyncClient(target) as client:
        runs = await lone_runs(lambda ids, k: token_times(client, ids, k), plan, vocab_size, advance)
    first = [marks[0] - started - model.prefill_s(n, n) for n, started, marks in runs]
    handoff = [marks[1] - marks[0] - model.transfer_s(-(-n // block_size) * block_size * kv_bytes_per_token, transport)
               - model.decode_step_s(1, n + 1) for n, _, marks in runs]
    return LoneLatencies(max(0.0, statistics.median(first)), max(0.0, statistics.median(handoff)),
                         spread_of(by_length([n for n, _, _ in runs], first)), way_in_s(start_s, time.perf_counter()))


def traced_way_in_s(trace_dir: Path, prefill_id: str, decode_id: str, start_s: float, end_s: float) -> float | None:
    """The median way in of the Decode calls the decode worker's front end took in [start_s,
    end_s), from the two workers' join traces under `trace_dir`; None when none matched (a trace
    not written: an engine that could not load the trace)."""
    from pdserve.engine_step_trace import engine_joins
    from planner.validation_joins import hop_in_s, in_window

    ways = hop_in_s(engine_joins(trace_dir, prefill_id), in_window(engine_joins(trace_dir, decode_id), start_s, end_s))
    return float(statistics.median(ways)) if len(ways) else None


def by_length(lengths: list[int], values: list[float]) -> list[list[float]]:
    """`values` grouped by their prompt length (`lengths`, the same order), in order of first appearance."""
    groups: dict[int, list[float]] = {}
    for n, value in zip(lengths, values):
        groups.setdefault(n, []).append(value)
    return list(groups.values())


async def _steady_run(target: str, rate_rps: float, num_requests: int, prompt_tokens: int, output_tokens: int,
                      groups: dict, seed: int, backend: str = "pdserve"):
    from loadgen.harness import WorkloadConfig, make_target
    from loadgen.prompts import PromptSynthesizer
    from loadgen.runner import RunConfig, run

    specs = WorkloadConfig(kind="random", arrival="poisson", rate_rps=rate_rps, num_requests=num_requests,
                           prompt_mean=prompt_tokens, output_mean=output_tokens, seed=seed).build()
    target_ = make_target(backend, target)
    await target_.open()
    try:
        before, started = {name: pids() for name, pids in groups.items()}, time.perf_counter()
        result = await run(target_, specs, PromptSynthesizer(seed=seed), RunConfig())
        after, wall_s = {name: pids() for name, pids in groups.items()}, time.perf_counter() - started
    finally:
        await target_.close()
    failed = [r for r in result.records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(result.records)} profiling requests failed: {failed[0].error}")
    return CpuRun(len(result.records), sum(r.output_tokens for r in result.records),
                  {name: after[name] - before[name] for name in groups}, wall_s,
                  sum(r.prompt_tokens for r in result.records))


def idle_cpu_cores(groups: dict, idle_s: float) -> dict[str, float]:
    """Each group's CPU, in cores, over `idle_s` with no traffic."""
    before, started = {name: pids() for name, pids in groups.items()}, time.perf_counter()
    time.sleep(idle_s)
    after, wall_s = {name: pids() for name, pids in groups.items()}, time.perf_counter() - started
    return {name: max(0.0, after[name] - before[name]) / wall_s for name in groups}


def measure_cpu(target: str, pids: dict[str, int], model: PerfModel, plan: ServingPlan,
                advance) -> tuple[ServingCosts, dict[str, float]]:
    """The per-request and per-prompt-token CPU terms of `ServingCosts`, the router's own share
    of the host's included; `pids` names the router's and each worker's main process. (The
    per-token terms come from `fit_served_steps`, where they are amortised as under load.) The
    two runs of `plan.load_prompt_tokens` go at `steady_rate`; the long-prompt run (where the plan
    has one) at the rate that keeps its prompts' engine as busy, `long_prompt_requests` of them.
    Returns the terms and each group's idle load (cores), which the batched runs' windows are net of."""
    groups = {  # each worker's API process and its KV connector's threads (see the module doc)
        "decode": lambda: cpu_seconds([pids["decode"]]) + named_threads_cpu_s(pids["decode"], KV_THREAD_PREFIX),
        "prefill": lambda: cpu_seconds([pids["prefill"]]) + named_threads_cpu_s(pids["prefill"], KV_THREAD_PREFIX),
        "router": lambda: cpu_seconds(process_tree(pids["router"])),
        "host": lambda: host_cpu_seconds(pids["router"]),
    }
    return steady_cpu(target, groups, model, plan, advance)


def steady_cpu(target: str, groups: dict, model: PerfModel, plan: ServingPlan, advance,
               backend: str = "pdserve") -> tuple[ServingCosts, dict[str, float]]:
    """`measure_cpu`'s runs against `target` (a `loadgen.harness.make_target` address of `backend`),
    reading `groups` (name -> the group's CPU seconds so far), and its result: the terms of the
    groups read (`cpu_terms`) and each group's idle load in cores."""
    rate_rps = steady_rate(model, plan.load_prompt_tokens)
    time.sleep(LONE_PAUSE_S)  # past the last request's polling
    idle = idle_cpu_cores(groups, min(MAX_IDLE_S, max(MIN_IDLE_S, 0.1 * plan.load_requests / rate_rps)))

    def steady(rate: float, requests: int, prompt_tokens: int, output_tokens: int, seed: int) -> CpuRun:
        run = asyncio.run(_steady_run(target, rate, requests, prompt_tokens, output_tokens, groups, seed, backend))
        advance(f"serving: CPU at {rate:.2f} req/s, {prompt_tokens}-token prompts, {output_tokens}-token outputs")
        return run.net_of_idle(idle)

    short = steady(rate_rps, plan.load_requests, plan.load_prompt_tokens, SHORT_OUTPUT, seed=11)
    long = steady(rate_rps, plan.load_requests, plan.load_prompt_tokens, LONG_OUTPUT, seed=12)
    long_prompts = reference = None
    if plan.long_prompt_tokens:
        long_rate = steady_rate(model, plan.long_prompt_tokens)
        requests = long_prompt_requests(long_rate, plan.load_requests)
        # the same rate and count with short prompts, which the long prompts' CPU is read against
        reference = steady(long_rate, requests, plan.load_prompt_tokens, SHORT_OUTPUT, seed=14)
        long_prompts = steady(long_rate, requests, plan.long_prompt_tokens, SHORT_OUTPUT, seed=13)
    return cpu_terms(short, long, long_prompts, host_cores=len(os.sched_getaffinity(0)), reference=reference), idle


def measure_serving(engine: EngineSettings, transport: str, cores: tuple[str, str], model: PerfModel,
                    engine_rows: Sequence[DecodeSample], kv_bytes_per_token: int, quick: bool,
                    advance) -> ServingCosts:
    """Starts a 1P+1D cluster on `cores` (prefill, decode) and measures every `ServingCosts` term
    against `model`, the engine-only fit, and `engine_rows`, the decode table it was fitted on."""
    from pdserve.client import Client
    from launch.local import ClusterSpec, LocalCluster

    plan = serving_plan(engine.max_model_len, engine.max_num_seqs, quick)
    spec = ClusterSpec(engine=engine, transport=transport, cpu_cores={"prefill": cores[0], "decode": cores[1]})
    with tempfile.TemporaryDirectory(prefix="pdserve-profile-trace-") as trace_dir, \
            traced_engines(Path(trace_dir)), LocalCluster(spec) as cluster:
        with Client(cluster.grpc_target) as client:  # the cluster is up: its router routes to both workers
            info = client.model_info()
        advance("serving: cluster up")
        ids = cluster.worker_ids("prefill")[0], cluster.worker_ids("decode")[0]
        lone = asyncio.run(lone_request_latencies(
            cluster.grpc_target, model, kv_bytes_per_token, engine.block_size, transport, plan, info.vocab_size,
            advance, lambda start_s, end_s: traced_way_in_s(Path(trace_dir), *ids, start_s, end_s)))
        warmup = measure_join_warmup(cluster.grpc_target, Path(trace_dir), ids[1], plan, info.vocab_size, advance)
        pids = {"router": cluster.router.pid,
                **{role: cluster.workers[cluster.worker_ids(role)[0]].pid for role in ("prefill", "decode")}}
        cpu, idle = measure_cpu(cluster.grpc_target, pids, model, plan, advance)
        cpu = replace(cpu, client_placement=MEASURED_CLIENT_PLACEMENT)   # what the served step is netted with
        steps = measure_served_steps(cluster.grpc_target, UnboundCpu.of_router(pids["router"]), model, engine_rows, cpu,
                                     cpu.router_request_cpu_s(BATCH_PROMPT_TOKENS), info.vocab_size, plan, advance,
                                     idle_cores=idle)
        prompt_loss, idle_loss, corun_rows = measured_prompt_loss(cluster.grpc_target, Path(trace_dir), *ids, model,
                                                                  plan, info.vocab_size, advance)
    lone_prompt = statistics.median(plan.prompt_tokens)  # the lone latencies are medians over these
    served = replace(cpu, decode_step_s=steps.decode_step_s, decode_cpu_s_per_token=steps.decode_cpu_s_per_token,
                     host_cpu_s_per_token=steps.host_cpu_s_per_token,
                     router_cpu_s_per_token=steps.router_cpu_s_per_token,
                     host_cpu_s_per_step=steps.host_cpu_s_per_step, router_cpu_s_per_step=steps.router_cpu_s_per_step,
                     decode_step_spread_s=steps.spread_s, served_batch_runs=steps.batch_runs,
                     served_batch_windows_s=steps.batch_windows_s,
                     served_step_extra_s=steps.extra_by_batch, prompt_loss_by_batch=prompt_loss,
                     prompt_idle_loss=idle_loss)
    served = replace(with_served_corun(served, corun_rows, advance), **warmup)
    # the lone handoff held the request's first decode step alone: what serving adds to it is charged there
    handoff_s, idle_join_s = split_lone_handoff(
        lone.handoff_s - cpu.decode_request_cpu_s(lone_prompt) - served.decode_serving_s(1, by_batch=False),
        lone.way_in_s)
    first_token_s = max(0.0, lone.first_token_s - cpu.prefill_request_cpu_s(lone_prompt))
    # the idle loss the simulator charges a prompt's step is in the lone latency: the part it is of it
    excess_s = min(first_token_s, first_token_idle_excess_s(idle_loss, model, int(lone_prompt),
                                                           cpu.prefill_request_cpu_s(lone_prompt)))
    return replace(served, first_token_s=first_token_s, first_token_idle_excess_s=excess_s,
                   handoff_s=handoff_s, idle_join_s=idle_join_s, first_token_spread_s=lone.first_token_spread_s)


def measure_join_warmup(target: str, trace_dir: Path, decode_id: str, plan: ServingPlan, vocab_size: int,
                        advance) -> dict[str, float]:
    """`ServingCosts`' join warm-up terms from `WARMUP_REPEATS` lone requests of `WARMUP_OUTPUT`
    tokens at the CPU runs' prompt length and the long prompts' (the longest lone one where the
    plan has none), read off the decode engine's trace in `trace_dir` (`join_warmup`); {} with a
    note where no length had enough runs (a trace not written) or a request broke: the profile
    keeps what it measured, and the simulator charges none."""
    from pdserve.client import AsyncClient
    from pdserve.engine_step_trace import engine_steps
    from planner.profiler.join_warmup import fit_join_warmup, warmup_excess_s, warmup_lines

    lengths = (plan.load_prompt_tokens, plan.long_prompt_tokens or max(plan.prompt_tokens))
    warm = replace(plan, prompt_tokens=tuple(dict.fromkeys(lengths)), repeats=WARMUP_REPEATS)

    async def send() -> None:
        async with AsyncClient(target) as client:
            await lone_runs(lambda ids, _: token_times(client, ids, WARMUP_OUTPUT), warm, vocab_size,
                            lambda text: advance(text, step=False), label="serving: a request's first decode steps")

    from pdserve.errors import ServeError

    start_s = time.monotonic()
    try:
        asyncio.run(send())
    except (ServeError, *BROKEN_CONNECTION, OSError) as why:   # a probe the profile can go without
        advance(f"serving: a request's first decode steps were not measured ({type(why).__name__}: {why}); the "
                "simulator charges none", step=False)
        return {}
    steps = [s for s in engine_steps(trace_dir, decode_id) if s.start_s >= start_s]
    rows = warmup_excess_s(steps)
    fit = fit_join_warmup(rows)
    for line in warmup_lines(rows, fit):
        advance(f"serving: a request's first decode steps, {line}", step=False)
    if fit is None:
        advance("serving: no request's first decode steps could be read (too few runs in the trace); the "
                "simulator charges none", step=False)
        return {}
    return {"join_warmup_s": fit[0], "join_warmup_s_per_context_token": fit[1]}


def measured_prompt_loss(target: str, trace_dir: Path, prefill_id: str, decode_id: str, model: PerfModel,
                         plan: ServingPlan, vocab_size: int, advance
                         ) -> tuple[tuple[tuple[int, float, float], ...], tuple[float, ...], list]:
    """`prompt_loss_probe.measure_prompt_loss`'s rows over idle, the idle row itself
    (`prompt_loss_fit.idle_loss`: (stretch, lost s), () where not read) and its decode side's
    co-run rows; (), () and [] with a note where the probes could not be read (the trace not
    written, or a stream broken): the profile keeps what it measured."""
    from pdserve.errors import ServeError
    from planner.profiler.prompt_loss_fit import idle_loss
    from planner.profiler.prompt_loss_probe import measure_prompt_loss

    try:
        by_bucket, rows, corun_rows = measure_prompt_loss(target, trace_dir, prefill_id, decode_id, model, plan,
                                                          vocab_size, advance)
    except (ServeError, *BROKEN_CONNECTION, OSError) as why:   # a probe the profile can go without
        advance(f"serving: the prompt steps beside streams were not measured ({type(why).__name__}: {why}); "
                "the simulator charges the host model alone there", step=False)
        return (), (), []
    if not rows:
        advance(f"serving: the prompt steps beside streams gave no row over idle (buckets read: {sorted(by_bucket)}); "
                "the simulator charges the host model alone there", step=False)
    return rows, idle_loss(by_bucket) or (), corun_rows


def first_token_idle_excess_s(idle: Sequence[float], model: PerfModel, prompt_tokens: int, cpu_s: float) -> float:
    """What the idle loss (`prompt_loss_fit.idle_loss`: (stretch, lost s)) charged to a lone
    prompt's step adds to it: the simulator charges an idle step of t (the model's) and the
    worker's CPU `cpu_s` for it t + `cpu_s` without the loss and lost s + stretch x (t + `cpu_s`)
    with it (`PrefillInstance.start_step`), so lost s + (stretch - 1) x (t + `cpu_s`); 0 without an
    idle loss. (The stretch over the model's step alone, as the trace reads it, fitted the kept
    validation worse: BENCHMARKS, "Prompt steps charged as measured".) Pure."""
    if not idle:
        return 0.0
    stretch, lost_s = idle
    return lost_s + (stretch - 1.0) * (model.prefill_step_s(prompt_tokens, prompt_tokens ** 2) + cpu_s)


def with_served_corun(served: ServingCosts, rows: Sequence, advance) -> ServingCosts:
    """`served` with the decode step's co-run stretch the prompt-loss probes' windows showed
    (`prompt_loss_fit.served_decode_corun`, net of `served`'s own host model), said so; as it is,
    with a note, where no batch had enough steps on both sides."""
    from planner.profiler.prompt_loss_fit import served_decode_corun
    from planner.profiler.stream_fit import StreamCpu

    stretch, lines = served_decode_corun(rows, StreamCpu.of(served), served.host_cores, served.client_placement)
    for line in lines:
        advance(f"serving: decode steps beside the probes' prompts, {line}", step=False)
    if stretch is None:
        advance("serving: too few decode steps beside the probes' prompts to read their co-run stretch; the "
                "simulator charges the two engines' (`co-run`)", step=False)
        return served
    advance(f"serving: a decode step beside a prompt, through the cluster and net of the host model: {stretch:g}x "
            "(the median over the streams' batches)", step=False)
    return replace(served, corun_decode_stretch_served=stretch)


@contextmanager
def traced_engines(trace_dir: Path):
    """The workers started inside it trace their engines' steps and joins into `trace_dir` (they
    inherit the variable as they start: `pdserve.engine_step_trace`); the variable as it was after."""
    from pdserve.engine_step_trace import STEP_TRACE_ENV

    before = os.environ.get(STEP_TRACE_ENV)
    os.environ[STEP_TRACE_ENV] = str(trace_dir)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STEP_TRACE_ENV, None)
        else:
            os.environ[STEP_TRACE_ENV] = before
