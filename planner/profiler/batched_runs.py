"""The served decode step, measured: batches of B requests sent at once through a running cluster
(pdserve's router, or vLLM's server: `planner.profiler.vllm_server_probe`), each run read where all
B decode together, with the unbound processes' CPU read over the window in which every request
streams (`StreamWindowReader`), and fitted (`planner.profiler.stream_fit`, the pure half) into what
serving adds to the engine's step at each batch and a line through it. A batch whose two runs'
steps differ by more than `stream_fit.SECOND_LOOK_SPREAD` is run once more and its median run
fitted. `planner.profiler.serving_probe` starts the cluster and calls `measure_served_steps`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from loadgen.proc_cpu import cpu_seconds, process_tree
from planner.perf_model import PerfModel
from planner.profile import DecodeSample
from planner.profiler.serving_fit import ServingPlan
from planner.profiler.spread import spread_of
from planner.profiler.stream_fit import (BATCH_OUTPUT_TOKENS, BATCH_PROMPT_TOKENS, SECOND_LOOK_SPREAD, BatchRun,
                                         NoCommonWindow, ServedSteps, StreamWindow, batch_output_attempts, batch_run_of,
                                         batches_to_measure_again, fit_served_steps, median_runs,
                                         served_extra_by_batch, served_residuals_s, stream_cpu_terms)
from planner.profiler.served_refit import kept_row, kept_window
from planner.serving_costs import ServingCosts


def host_cpu_seconds(router_pid: int) -> float:
    """CPU seconds of the processes bound to no worker: the router's tree and this process (the client)."""
    return cpu_seconds(process_tree(router_pid)) + time.process_time()


async def batched_decode_run(target: str, batch: int, vocab_size: int, host_cpu, seed: int,
                             output_tokens: int = BATCH_OUTPUT_TOKENS, router_cpu=None) -> BatchRun:
    """Sends `batch` short-prompt requests at once and times the steps they decode together;
    `host_cpu` and `router_cpu` (optional) read the CPU seconds of the unbound processes and of the
    router alone. Raises NoCommonWindow when they never did."""
    import numpy as np

    from pdserve.client import AsyncClient

    rng = np.random.default_rng(seed)
    prompts = [[int(i) for i in rng.integers(10, vocab_size, size=BATCH_PROMPT_TOKENS)] for _ in range(batch)]
    reader = StreamWindowReader(batch, host_cpu, router_cpu)

    async def stream(client, ids: list[int]) -> list[float]:
        marks: list[float] = []
        async for chunk in client.generate(token_ids=ids, max_tokens=output_tokens, ignore_eos=True, temperature=0.0):
            had = len(marks)
            marks += [time.perf_counter()] * len(chunk.token_ids)
            if had < 2 <= len(marks):
                reader.second_token()
        reader.ended()
        return marks

    async with AsyncClient(target) as client:
        router_before, cpu_before = router_cpu() if router_cpu else 0.0, host_cpu()
        runs = await asyncio.gather(*(stream(client, ids) for ids in prompts))
        cpu_after, router_after = host_cpu(), router_cpu() if router_cpu else 0.0
    run = batch_run_of(batch, runs, cpu_after - cpu_before, router_after - router_before)
    return replace(run, window=reader.window(runs))


class StreamWindowReader:
    """Reads the unbound processes' CPU when the last of `batch` streams has its second token and
    again when the first one ends: the stretch in which every request streams (`StreamWindow`)."""

    def __init__(self, batch: int, host_cpu, router_cpu=None) -> None:
        self.batch, self._host_cpu, self._router_cpu = batch, host_cpu, router_cpu
        self._past_second = 0  # streams that have their second token
        self.start: tuple[float, float, float] | None = None
        self.end: tuple[float, float, float] | None = None

    def _read(self) -> tuple[float, float, float]:
        return time.perf_counter(), self._host_cpu(), self._router_cpu() if self._router_cpu else 0.0

    def second_token(self) -> None:
        self._past_second += 1
        if self._past_second == self.batch and self.start is None:
            self.start = self._read()

    def ended(self) -> None:
        if self.start is not None and self.end is None:
            self.end = self._read()

    def window(self, runs: Sequence[Sequence[float]]) -> StreamWindow | None:
        """The window read, with the tokens received inside it; None when it was never open."""
        if self.start is None or self.end is None or self.end[0] <= self.start[0]:
            return None
        tokens = sum(1 for marks in runs for t in marks if self.start[0] < t <= self.end[0])
        return StreamWindow(self.end[0] - self.start[0], tokens, self.end[1] - self.start[1],
                            self.end[2] - self.start[2])


@dataclass(frozen=True)
class UnboundCpu:
    """Readers of CPU seconds so far: `host`, every process bound to no worker (the router's or the
    server's front end, and this client); `router`, the router's (or the front end's) part of it."""

    host: Callable[[], float]
    router: Callable[[], float]

    @classmethod
    def of_router(cls, router_pid: int) -> UnboundCpu:
        """A pdserve cluster's: the router's process tree, and it with this process."""
        return cls(lambda: host_cpu_seconds(router_pid), lambda: cpu_seconds(process_tree(router_pid)))


def _broken_connection() -> tuple[type[BaseException], ...]:
    import httpx

    from pdserve.errors import DeadlineExceeded, NoHealthyWorker

    return httpx.TransportError, ConnectionError, TimeoutError, NoHealthyWorker, DeadlineExceeded


# What ends a batched run without its measuring anything wrong: the connection to the server (vLLM's
# over HTTP, the router over gRPC through pdserve's client) broke or did not open in time
BROKEN_CONNECTION = _broken_connection()


def measure_served_steps(target: str, unbound: UnboundCpu | None, model: PerfModel, engine_rows: Sequence[DecodeSample],
                         host: ServingCosts, router_cpu_s_per_request: float, vocab_size: int, plan: ServingPlan,
                         advance, run_batch=None, label: str = "serving",
                         idle_cores: dict[str, float] | None = None, engine_cores: float = 1.0) -> ServedSteps:
    """Runs `fit_served_steps` on one batched run per entry of `plan.decode_batches` and, for a
    batch whose two runs' steps differ by more than `SECOND_LOOK_SPREAD`, one more (a note, not a
    step of the plan's progress), the run of the median step of the three fitted and kept (`run_batch`:
    `batched_decode_run`'s signature; tests and `vllm_server_probe` give their own; `unbound`
    None: no host CPU read; `label` heads the progress notes). A run whose
    requests never decoded together (on a slow or busy host the first can finish before the last
    one's KV arrives) is retried with outputs twice as long, up to `batch_output_attempts`, and so is
    a run whose connection broke (`BROKEN_CONNECTION`: a VM that stalled the client or the server
    for seconds; a run times nothing then, it is measured again); a batch that still fails is skipped
    with a note, and the fit runs on the rest (one batch size left: its step alone, no per-token
    term, said in a note); none left raises.
    The spread is that of every run's gaps around the run's own median step. The unbound CPU per
    step and per token is `stream_cpu_terms`' over the runs' windows, net of `idle_cores` (the
    groups "host" and "router": their load with no traffic; None: 0). `engine_cores`: the cores the
    served engine spans (`fit_served_steps`)."""
    run_batch = run_batch or batched_decode_run
    host_cpu, router_cpu = (unbound.host, unbound.router) if unbound is not None else (None, None)

    def measured(batch: int, seed: int):
        for output_tokens in batch_output_attempts(plan.max_output_tokens):
            try:
                return asyncio.run(run_batch(target, batch, vocab_size, host_cpu, seed=seed,
                                             output_tokens=output_tokens, router_cpu=router_cpu))
            except NoCommonWindow as why:
                advance(f"{label}: batch {batch}: {why}; again with {output_tokens * 2} output tokens", step=False)
            except BROKEN_CONNECTION as why:
                advance(f"{label}: batch {batch}: the connection broke ({type(why).__name__}: {why}); again", step=False)
        return None

    runs, skipped = [], []
    for index, batch in enumerate(plan.decode_batches):
        run = measured(batch, seed=100 + index)
        if run is None:
            skipped.append(batch)
        else:
            runs.append(run)
        advance(f"{label}: decode steps at batch {batch}")
    looked_again = batches_to_measure_again(runs)
    for index, batch in enumerate(looked_again):
        steps = ", ".join(f"{run.step_s * 1e3:.1f}" for run in runs if run.batch == batch)
        advance(f"{label}: batch {batch}: its runs took {steps} ms a step, more than "
                f"{SECOND_LOOK_SPREAD:.0%} apart; once more, the median kept", step=False)
        if (run := measured(batch, seed=200 + index)) is not None:
            runs.append(run)
    spread_s = spread_of(run.gaps_s for run in runs)
    runs = median_runs(runs, looked_again)
    if not runs:
        raise RuntimeError(f"served decode steps: the requests of batches {skipped} never decoded together even "
                           "with longer outputs (is max_num_seqs below the batch, or the host too busy?)")
    if len({run.batch for run in runs}) < 2:
        advance(f"{label}: only batch {runs[0].batch} decoded together (batches {skipped} never did: streams that "
                "arrive in bursts, or a host too busy); its step is fitted alone, with no per-token term", step=False)
    elif skipped:
        advance(f"{label}: skipped batches {skipped} (never decoded together); fitted on the others", step=False)
    idle_cores = idle_cores or {}
    stream = stream_cpu_terms(runs, idle_cores.get("host", 0.0), idle_cores.get("router", 0.0), router_cpu_s_per_request)
    step_s, per_token_s, host_per_token_s = fit_served_steps(runs, model, host, router_cpu_s_per_request, engine_rows,
                                                             stream, engine_cores, host.client_placement)
    residuals_s = served_residuals_s(runs, model, host.host_cores, stream, engine_rows, engine_cores,
                                     host.client_placement)
    return ServedSteps(step_s, per_token_s, host_per_token_s, spread_s,
                       stream.router_per_token_s, stream.host_per_step_s, stream.router_per_step_s,
                       tuple(kept_row(run) for run in runs),
                       served_extra_by_batch([run.batch for run in runs], residuals_s),
                       tuple(kept_window(run) for run in runs))
