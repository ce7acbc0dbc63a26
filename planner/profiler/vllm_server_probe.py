"""What vLLM's own OpenAI server adds around its engine, measured the way `serving_probe` measures
pdserve's cluster: the serving costs of the baseline every goodput comparison is judged against
(A: one vLLM server over both cores), so that the planner predicts the baseline with the
baseline's costs and not with pdserve's.

The server runs the profile's wide engine (the same engine settings, bound to every core the
cluster's two workers had); its API process (HTTP, the output processor, detokenizing, the SSE
stream) shares those cores with the engine. Against the wide engine's engine-only fit and decode
table:
- `first_token_s`: lone requests (`LONE_PAUSE_S` apart, token ids, so nothing is tokenized), TTFT
  minus the wide engine's prefill of the prompt; the median, and the spread within each length;
- the CPU of the processes apart from the engine, as the cluster probe reads its router's and
  client's (`serving_probe.steady_cpu`, the same steady Poisson runs): the API process alone is
  the "router" group (`front_end_cpu`), it and this client the "host" group, per request, prompt
  token, streamed token and streaming step; `host_cores` the cores the server runs on. The
  simulator charges them through its host model (`planner.simulator.host`; nothing is bound apart,
  so all of it takes the engine's cores), as it charges pdserve's router and client. Without
  them (before this measurement: `host_cores` 0) vLLM's server was replayed 27-48% optimistic on
  goodput on an AMX Xeon where pdserve's one-core topologies were within 10% (9-37% with them and the
  simulator's team stretch):
  the load generator's CPU was charged to pdserve and not to vLLM, and vLLM's front end's own
  per-request work not at all;
- `decode_step_s`, `decode_cpu_s_per_token`: B streams sent at once, the median gap between a
  stream's tokens once all B decode (`stream_fit.settled_window`, as the cluster probe), minus
  the wide engine's step at B (its own table row) and what the host model charges the streams'
  CPU there (an engine over every core: the front end's load holds the whole step), fits a + b * B
  (`stream_fit.fit_served_steps`) and keeps the median at each B (`served_step_extra_s`, what the
  simulator charges); their spread.
Each batch size runs `BATCH_REPEATS` times, twice the cluster probe's: on an AVX-512 EPYC one run's
median gap sat either 1-3 or 6-8 ms above the engine's step, run to run at the same batch (probably
where the floating API process lands against the engine's threads), so a few runs fit one mode or
the other; the fit over more runs is their mean, which is what a request's TPOT sees over many steps.
The rest stays 0: a server has no handoff and no second worker.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

from loadgen.proc_cpu import cpu_seconds
from pdserve.engine import EngineSettings
from planner.perf_model import PerfModel
from planner.profile import DecodeSample
from planner.profiler.serving_fit import ServingPlan, serving_plan
from planner.profiler.batched_runs import StreamWindowReader, UnboundCpu, measure_served_steps
from planner.profiler.serving_probe import by_length, lone_runs, steady_cpu
from planner.profiler.spread import spread_of
from planner.profiler.stream_fit import BATCH_OUTPUT_TOKENS, BATCH_PROMPT_TOKENS, batch_run_of
from planner.serving_costs import ServingCosts

BATCH_REPEATS = 4  # runs of each batch size (see the module's doc)


async def token_times(target, ids: list[int], max_tokens: int, reader: StreamWindowReader | None = None) -> list[float]:
    """When each token of a greedy, exact-length request for `ids` reached this process
    (`target`: an open `loadgen.targets.openai_http.OpenAITarget` with vLLM's extensions); told to
    `reader` (optional): its second token, and its end."""
    from loadgen.prompts import Prompt

    marks: list[float] = []
    async for delta in target.generate(Prompt(tuple(ids), max_tokens)):
        if delta.content:
            had = len(marks)
            marks += [time.perf_counter()] * (delta.num_tokens or 1)
            if reader is not None and had < 2 <= len(marks):
                reader.second_token()
    if reader is not None:
        reader.ended()
    return marks


async def lone_first_token(url: str, model: PerfModel, plan: ServingPlan, vocab_size: int,
                           advance) -> tuple[float, tuple[float, ...]]:
    """(median, spread) of the lone requests' TTFT beyond `model`'s prefill."""
    from loadgen.targets.openai_http import OpenAITarget

    target = OpenAITarget(url)
    await target.open()
    try:
        runs = await lone_runs(lambda ids, k: token_times(target, ids, k), plan, vocab_size, advance,
                               label="vLLM's server")
    finally:
        await target.close()
    first = [marks[0] - started - model.prefill_s(n, n) for n, started, marks in runs]
    return max(0.0, statistics.median(first)), spread_of(by_length([n for n, _, _ in runs], first))


async def batched_run(url: str, batch: int, vocab_size: int, host_cpu, seed: int,
                      output_tokens: int = BATCH_OUTPUT_TOKENS, router_cpu=None):
    """`batched_runs.batched_decode_run` against vLLM's server: `batch` short prompts at once;
    `host_cpu` and `router_cpu` (None: not read) read the front end's and this client's CPU, and the
    front end's alone (`front_end_cpu`). Raises `NoCommonWindow` when they never decoded together."""
    import numpy as np

    from loadgen.targets.openai_http import OpenAITarget

    rng = np.random.default_rng(seed)
    prompts = [[int(i) for i in rng.integers(10, vocab_size, size=BATCH_PROMPT_TOKENS)] for _ in range(batch)]
    reader = StreamWindowReader(batch, host_cpu, router_cpu) if host_cpu is not None else None
    target = OpenAITarget(url)
    await target.open()
    try:
        router_before, cpu_before = router_cpu() if router_cpu else 0.0, host_cpu() if host_cpu else 0.0
        runs = await asyncio.gather(*(token_times(target, ids, output_tokens, reader) for ids in prompts))
        cpu_after, router_after = host_cpu() if host_cpu else 0.0, router_cpu() if router_cpu else 0.0
    finally:
        await target.close()
    run = batch_run_of(batch, runs, cpu_after - cpu_before, router_after - router_before)
    return replace(run, window=reader.window(runs)) if reader is not None else run


def front_end_cpu(api_pid: int) -> UnboundCpu:
    """vLLM's server's processes apart from its engine: `router`, the API process alone (HTTP, the
    output processor, detokenizing, the SSE stream; its engine core is a child, not counted); `host`,
    it and this process, the client, as the cluster probe's host group holds the router and the client."""
    return UnboundCpu(lambda: cpu_seconds([api_pid]) + time.process_time(), lambda: cpu_seconds([api_pid]))


def measure_vllm_server(engine: EngineSettings, model: PerfModel, engine_rows: Sequence[DecodeSample],
                        vocab_size: int, quick: bool, advance, log_path=None) -> ServingCosts:
    """Starts vLLM's server on `engine` (the wide engine's settings: its cores are the server's)
    and measures it (`measure_server_at`). Steps reported: `vllm_server_steps(...)`."""
    from loadgen.vllm_server import VllmOpenAIServer

    plan = serving_plan(engine.max_model_len, engine.max_num_seqs, quick, BATCH_REPEATS)
    with VllmOpenAIServer(engine, log_path=log_path) as server:
        advance("vLLM's server: up")
        return measure_server_at(server.url, model, engine_rows, plan, vocab_size, advance, server.pid)


def measure_server_at(url: str, model: PerfModel, engine_rows: Sequence[DecodeSample], plan: ServingPlan,
                      vocab_size: int, advance, api_pid: int | None = None) -> ServingCosts:
    """The `ServingCosts` of the vLLM server at `url` against `model`, its engine's fit, and
    `engine_rows`, the decode table that was fitted on (see the module's doc); `api_pid`, its API
    process, whose CPU and this client's are measured as the cluster's router's and client's are
    (None: not measured, the host model left off)."""
    first_token_s, first_spread = asyncio.run(lone_first_token(url, model, plan, vocab_size, advance))
    cpu, idle, unbound = ServingCosts(), {}, None
    if api_pid is not None:
        unbound = front_end_cpu(api_pid)
        cpu, idle = steady_cpu(url, {"host": unbound.host, "router": unbound.router}, model, plan, advance,
                               backend="openai")
    steps = measure_served_steps(url, unbound, model, engine_rows, cpu, cpu.router_request_cpu_s(BATCH_PROMPT_TOKENS),
                                 vocab_size, plan, advance, run_batch=batched_run, label="vLLM's server",
                                 idle_cores=idle, engine_cores=cpu.host_cores or 1)
    return replace(cpu, first_token_s=first_token_s, decode_step_s=steps.decode_step_s,
                   decode_cpu_s_per_token=steps.decode_cpu_s_per_token, host_cpu_s_per_token=steps.host_cpu_s_per_token,
                   router_cpu_s_per_token=steps.router_cpu_s_per_token, host_cpu_s_per_step=steps.host_cpu_s_per_step,
                   router_cpu_s_per_step=steps.router_cpu_s_per_step, first_token_spread_s=first_spread,
                   decode_step_spread_s=steps.spread_s, served_batch_runs=steps.batch_runs,
                   served_batch_windows_s=steps.batch_windows_s,
                   served_step_extra_s=steps.extra_by_batch)


def vllm_server_steps(max_model_len: int, max_num_seqs: int, quick: bool) -> int:
    """Progress steps `measure_vllm_server` reports: the server's start, the lone lengths, the
    CPU runs and the batches, as the cluster probe's (`ServingPlan.steps`)."""
    return serving_plan(max_model_len, max_num_seqs, quick, BATCH_REPEATS).steps
