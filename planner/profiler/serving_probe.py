"""What serving adds around the engines (`planner.profile.ServingCosts`), measured on a real
1P+1D local cluster against an engine-only fit of the same engine settings.

- Latencies, from lone requests sent one at a time (nothing queues): what the client sees beyond
  what the engine-only model predicts.
    first_token_s = TTFT - prefill(n)
    handoff_s     = (second token - first token) - KV transfer(n) - decode step(1, n + 1)
  Medians over a few prompt lengths and repeats.
- CPU, from two steady Poisson runs at the same request rate, one with short and one with long
  outputs. The CPU seconds each group of processes took (from /proc) over each run solve
  cpu = a * requests + b * tokens per group:
    the decode worker's processes but its model runner  -> decode_cpu_s_per_request / _per_token
    the prefill worker's processes but its model runner -> prefill_cpu_s_per_request
    the router and this process (the client)            -> host_cpu_s_per_request / _per_token
  The model runners' own time is the engine's, which the engine tables hold already.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from pdserve.engine import EngineSettings
from planner.perf_model import PerfModel
from planner.profile import ServingCosts

MODEL_RUNNER_NAME = "VLLM::Worker"  # vLLM's model-runner process title (its compute is the engine's)
SHORT_OUTPUT, LONG_OUTPUT = 2, 32


@dataclass(frozen=True)
class ServingPlan:
    prompt_tokens: tuple[int, ...]   # lone requests for the latencies
    repeats: int
    load_prompt_tokens: int          # the CPU runs' prompts
    load_requests: int               # per CPU run


def serving_plan(max_model_len: int, quick: bool) -> ServingPlan:
    prompts = tuple(n for n in (32, 128, 512) if n + LONG_OUTPUT < max_model_len) or (max_model_len // 4,)
    return ServingPlan(prompts, 3 if quick else 6, min(128, max_model_len // 4), 24 if quick else 60)


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc (Linux)."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        children += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return [pid] + [p for child in children for p in process_tree(child)]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used (0 for one that has exited)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def serving_pids(worker_pid: int) -> list[int]:
    """A worker's processes that are serving, not compute: all but its model runner."""
    return [p for p in process_tree(worker_pid) if not _title(p).startswith(MODEL_RUNNER_NAME)]


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except FileNotFoundError:
        return ""


@dataclass(frozen=True)
class CpuRun:
    requests: int
    tokens: int
    cpu_s: dict[str, float]  # group -> CPU seconds over the run


def solve_per_request_and_token(short: CpuRun, long: CpuRun, group: str) -> tuple[float, float]:
    """(a, b) of cpu = a*requests + b*tokens through the two runs, clamped at 0 (noise)."""
    d_tokens = long.tokens - short.tokens
    if d_tokens <= 0:
        raise ValueError("the long-output run must stream more tokens than the short one")
    per_token = max(0.0, (long.cpu_s[group] - short.cpu_s[group]) / d_tokens)
    per_request = max(0.0, (short.cpu_s[group] - per_token * short.tokens) / short.requests)
    return per_request, per_token


async def lone_request_latencies(target: str, model: PerfModel, kv_bytes_per_token: int, block_size: int,
                                 transport: str, plan: ServingPlan, vocab_size: int, advance) -> tuple[float, float]:
    """(first_token_s, handoff_s): medians of the measured minus the engine-only model's."""
    import numpy as np

    from pdserve.client import AsyncClient

    rng, first, handoff = np.random.default_rng(7), [], []
    async with AsyncClient(target) as client:
        for n in plan.prompt_tokens:
            for _ in range(plan.repeats):
                ids = [int(i) for i in rng.integers(10, vocab_size, size=n)]
                started, marks = time.perf_counter(), []
                async for chunk in client.generate(token_ids=ids, max_tokens=3, ignore_eos=True, temperature=0.0):
                    marks += [time.perf_counter()] * len(chunk.token_ids)
                kv_bytes = -(-n // block_size) * block_size * kv_bytes_per_token
                first.append(marks[0] - started - model.prefill_s(n, n))
                handoff.append(marks[1] - marks[0] - model.transfer_s(kv_bytes, transport)
                               - model.decode_step_s(1, n + 1))
            advance(f"serving: lone {n}-token requests")
    return max(0.0, statistics.median(first)), max(0.0, statistics.median(handoff))


async def _steady_run(target: str, rate_rps: float, plan: ServingPlan, output_tokens: int, groups: dict, seed: int):
    from loadgen.harness import WorkloadConfig, make_target
    from loadgen.prompts import PromptSynthesizer
    from loadgen.runner import RunConfig, run

    specs = WorkloadConfig(kind="random", arrival="poisson", rate_rps=rate_rps, num_requests=plan.load_requests,
                           prompt_mean=plan.load_prompt_tokens, output_mean=output_tokens, seed=seed).build()
    target_ = make_target("pdserve", target)
    await target_.open()
    try:
        before = {name: pids() for name, pids in groups.items()}
        result = await run(target_, specs, PromptSynthesizer(seed=seed), RunConfig())
        after = {name: pids() for name, pids in groups.items()}
    finally:
        await target_.close()
    failed = [r for r in result.records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(result.records)} profiling requests failed: {failed[0].error}")
    return CpuRun(len(result.records), sum(r.output_tokens for r in result.records),
                  {name: after[name] - before[name] for name in groups})


def measure_cpu(target: str, pids: dict[str, int], rate_rps: float, plan: ServingPlan, advance) -> ServingCosts:
    """The CPU terms of `ServingCosts`; `pids` names the router's and each worker's main process."""
    groups = {
        "decode": lambda: cpu_seconds(serving_pids(pids["decode"])),
        "prefill": lambda: cpu_seconds(serving_pids(pids["prefill"])),
        "host": lambda: cpu_seconds(process_tree(pids["router"])) + time.process_time(),
    }
    short = asyncio.run(_steady_run(target, rate_rps, plan, SHORT_OUTPUT, groups, seed=11))
    advance(f"serving: CPU at {rate_rps:.2f} req/s, {SHORT_OUTPUT}-token outputs")
    long = asyncio.run(_steady_run(target, rate_rps, plan, LONG_OUTPUT, groups, seed=12))
    advance(f"serving: CPU at {rate_rps:.2f} req/s, {LONG_OUTPUT}-token outputs")
    decode_request, decode_token = solve_per_request_and_token(short, long, "decode")
    host_request, host_token = solve_per_request_and_token(short, long, "host")
    prefill_request = (short.cpu_s["prefill"] + long.cpu_s["prefill"]) / (short.requests + long.requests)
    return ServingCosts(decode_cpu_s_per_token=decode_token, decode_cpu_s_per_request=decode_request,
                        prefill_cpu_s_per_request=prefill_request, host_cpu_s_per_token=host_token,
                        host_cpu_s_per_request=host_request, host_cores=len(os.sched_getaffinity(0)))


def steady_rate(model: PerfModel, prompt_tokens: int) -> float:
    """A request rate that keeps both engines about a third busy at the CPU runs' long outputs."""
    per_request_s = max(model.prefill_s(prompt_tokens, prompt_tokens),
                        LONG_OUTPUT * model.decode_step_s(1, prompt_tokens))
    return 0.3 / per_request_s


def measure_serving(engine: EngineSettings, transport: str, cores: tuple[str, str], model: PerfModel,
                    kv_bytes_per_token: int, quick: bool, advance) -> ServingCosts:
    """Starts a 1P+1D cluster on `cores` (prefill, decode) and measures every `ServingCosts` term."""
    from dataclasses import replace

    from pdserve.client import Client
    from pdserve.launcher import ClusterSpec, LocalCluster

    plan = serving_plan(engine.max_model_len, quick)
    spec = ClusterSpec(engine=engine, transport=transport, cpu_cores={"prefill": cores[0], "decode": cores[1]})
    with LocalCluster(spec) as cluster:
        with Client(cluster.grpc_target) as client:
            deadline = time.monotonic() + 60
            while not ((info := client.model_info()).num_prefill_workers and info.num_decode_workers):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the profiling cluster's router never saw its workers; logs in {cluster.log_dir}")
                time.sleep(0.1)
        advance("serving: cluster up")
        first, handoff = asyncio.run(lone_request_latencies(
            cluster.grpc_target, model, kv_bytes_per_token, engine.block_size, transport, plan, info.vocab_size,
            advance))
        pids = {"router": cluster.router.popen.pid,
                **{role: cluster.workers[cluster.worker_ids(role)[0]].popen.pid for role in ("prefill", "decode")}}
        cpu = measure_cpu(cluster.grpc_target, pids, steady_rate(model, plan.load_prompt_tokens), plan, advance)
    return replace(cpu, first_token_s=first, handoff_s=handoff)
