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
- `decode_step_s`, `decode_cpu_s_per_token`: B streams sent at once, the median gap between a
  stream's tokens once all B decode (`serving_fit.settled_window`, as the cluster probe), minus
  the wide engine's step at B (its own table row), fits a + b * B (`serving_fit.fit_served_steps`,
  with no host model: the API process runs on the engine's cores, so what it takes shows in the
  gap, not as a stretch); their spread.
Each batch size runs `BATCH_REPEATS` times, twice the cluster probe's: on an AVX-512 EPYC one run's
median gap sat either 1-3 or 6-8 ms above the engine's step, run to run at the same batch (probably
where the floating API process lands against the engine's threads), so a few runs fit one mode or
the other; the fit over more runs is their mean, which is what a request's TPOT sees over many steps.
The rest stays 0: a server has no handoff, no router and no second worker, and `host_cores` 0 keeps
the simulator's host model off (the load generator, on the same host, is not modelled for the
baseline either; the cluster's profile charges it to pdserve through its host terms).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence

from pdserve.engine import EngineSettings
from planner.perf_model import PerfModel
from planner.profile import DecodeSample, ServingCosts
from planner.profiler.serving_fit import (BATCH_OUTPUT_TOKENS, BATCH_PROMPT_TOKENS, ServingPlan, batch_run_of,
                                          serving_plan)
from planner.profiler.serving_probe import by_length, lone_runs, measure_served_steps
from planner.profiler.spread import spread_of

BATCH_REPEATS = 4  # runs of each batch size (see the module's doc)


async def token_times(target, ids: list[int], max_tokens: int) -> list[float]:
    """When each token of a greedy, exact-length request for `ids` reached this process
    (`target`: an open `loadgen.targets.openai_http.OpenAITarget` with vLLM's extensions)."""
    from loadgen.prompts import Prompt

    marks: list[float] = []
    async for delta in target.generate(Prompt(tuple(ids), max_tokens)):
        if delta.content:
            marks += [time.perf_counter()] * (delta.num_tokens or 1)
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
    """`serving_probe.batched_decode_run` against vLLM's server: `batch` short prompts at once. No
    host CPU is read (`host_cpu`, `router_cpu` unused: nothing runs apart from the server's cores
    but this client). Raises `NoCommonWindow` when they never decoded together."""
    import numpy as np

    from loadgen.targets.openai_http import OpenAITarget

    rng = np.random.default_rng(seed)
    prompts = [[int(i) for i in rng.integers(10, vocab_size, size=BATCH_PROMPT_TOKENS)] for _ in range(batch)]
    target = OpenAITarget(url)
    await target.open()
    try:
        runs = await asyncio.gather(*(token_times(target, ids, output_tokens) for ids in prompts))
    finally:
        await target.close()
    return batch_run_of(batch, runs)


def measure_vllm_server(engine: EngineSettings, model: PerfModel, engine_rows: Sequence[DecodeSample],
                        vocab_size: int, quick: bool, advance, log_path=None) -> ServingCosts:
    """Starts vLLM's server on `engine` (the wide engine's settings: its cores are the server's)
    and measures it (`measure_server_at`). Steps reported: `vllm_server_steps(...)`."""
    from loadgen.vllm_server import VllmOpenAIServer

    plan = serving_plan(engine.max_model_len, engine.max_num_seqs, quick, BATCH_REPEATS)
    with VllmOpenAIServer(engine, log_path=log_path) as server:
        advance("vLLM's server: up")
        return measure_server_at(server.url, model, engine_rows, plan, vocab_size, advance)


def measure_server_at(url: str, model: PerfModel, engine_rows: Sequence[DecodeSample], plan: ServingPlan,
                      vocab_size: int, advance) -> ServingCosts:
    """The `ServingCosts` of the vLLM server at `url` against `model`, its engine's fit, and
    `engine_rows`, the decode table that was fitted on (see the module's doc)."""
    first_token_s, first_spread = asyncio.run(lone_first_token(url, model, plan, vocab_size, advance))
    steps = measure_served_steps(url, None, model, engine_rows, ServingCosts(), 0.0, vocab_size, plan, advance,
                                 run_batch=batched_run, label="vLLM's server")
    return ServingCosts(first_token_s=first_token_s, decode_step_s=steps.decode_step_s,
                        decode_cpu_s_per_token=steps.decode_cpu_s_per_token,
                        first_token_spread_s=first_spread, decode_step_spread_s=steps.spread_s)


def vllm_server_steps(max_model_len: int, max_num_seqs: int, quick: bool) -> int:
    """Progress steps `measure_vllm_server` reports."""
    plan = serving_plan(max_model_len, max_num_seqs, quick, BATCH_REPEATS)
    return 1 + len(plan.prompt_tokens) + len(plan.decode_batches)
