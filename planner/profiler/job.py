"""`pdserve profile`'s work: measure transfers and the engine, write the profile, report the fit.

Order: KV transfers first (no engine running, so they do not compete with it), then prefill and
decode timings of one colocated vLLM engine (prefix caching off) bound to the cores one worker
gets: the engine's own costs. With `ProfileJob.path` "cluster", then a real 1P+1D local cluster
measures what serving adds around those engines (`planner.profiler.serving_probe`: the hops'
latencies, the workers' and the router's CPU), then two engines on the two workers' cores at once
(`planner.profiler.corun_probe`: how much each slows the other); the profile's `serving` section
holds both, and (`ProfileJob.wide`) the same engine tables are measured again on one engine bound to both
workers' cores: the profile's `wide` engine, one worker spanning two devices, as vLLM's own server
runs on the host. The rest of a profile describes one device per worker. Before an engine goes
down, the rows of its tables that stand more than 10% off the table's fit are measured twice more
and the median kept (`planner.profiler.second_look`: a VM's slow stretch, not the engine).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loadgen.host_probe import (INTERPRETER_WINDOW_S, InterpreterSampler, interpreter_series, product_for_dtype,
                               speed_check_ms, wake_check_us)
from pdserve.cpu_placement import parse_cores
from pdserve.engine import EngineSettings as WorkerEngineSettings
from planner.perf_model import FitReport, PerfModel, fit_decode, fit_perf_model, fit_prefill
from planner.profile import (
    DecodeSample,
    EngineSettings,
    ModelInfo,
    PrefillSample,
    Profile,
    TransferSample,
    WideEngine,
    save_profile,
)
from planner.profiler.host import hardware_info, model_info
from planner.profiler.plan import ProfilePlan, make_plan
from planner.profiler.second_look import SECOND_LOOKS, kept_s, kept_span, rows_off_the_fit
from planner.profiler.summary import print_summary
from planner.profiler.transfer_probe import BlockGeometry, measure_transfers
from planner.serving_costs import ServingCosts


@dataclass(frozen=True)
class ProfileJob:
    engine: WorkerEngineSettings
    transports: tuple[str, ...] = ("shm", "tcp", "torch")  # the first is the cluster pass's (pdserve up's on one host)
    quick: bool = False
    out: Path = Path("profile.json")
    show_progress: bool = True
    path: Literal["engine", "cluster"] = "engine"
    cluster_cores: tuple[str, str] = ("0", "1")  # path "cluster": the prefill and the decode worker's cores
    wide: bool = True  # path "cluster": also the engine tables of one engine on both workers' cores
    vllm_server: bool = False  # with the wide engine: also vLLM's own server around it (the baseline's costs)

    def __post_init__(self) -> None:
        unknown = set(self.transports) - {"shm", "tcp", "torch"}
        if not self.transports or unknown:
            raise ValueError(f"--transports must list shm, tcp and/or torch, got {','.join(self.transports) or 'nothing'}")
        if self.path not in ("engine", "cluster"):
            raise ValueError(f"--through must be engine or cluster, got {self.path!r}")
        if self.vllm_server and (self.path != "cluster" or not self.wide):
            raise ValueError("--vllm-server measures vLLM's server around the wide engine: it needs --through "
                             "cluster, without --no-wide")


@dataclass(frozen=True)
class ProfileOutcome:
    profile: Profile
    fit: FitReport
    profile_path: Path
    plot_path: Path
    elapsed_s: float


def _progress(show: bool) -> Progress:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[last]}"), TimeElapsedColumn())
    return Progress(*columns, disable=not show)


def run_profile(job: ProfileJob, console: Console) -> ProfileOutcome:
    """Measure, write `job.out` and `<job.out stem>.png`, print the fit. Takes minutes (`quick`: ~1)."""
    started = time.perf_counter()
    product = product_for_dtype(job.engine.dtype)   # the engines' arithmetic, not another unit's
    every_core = sorted(os.sched_getaffinity(0))
    machine_ms_start, wake_us_start = speed_check_ms(every_core, product=product), wake_check_us(every_core)
    engine = replace(job.engine, enable_prefix_caching=False)
    if job.path == "cluster":
        engine = replace(engine, cpu_cores=job.cluster_cores[0])  # the engine alone, on one worker's cores
    model = model_info(engine.model, engine.dtype, engine.block_size)
    plan = make_plan(engine.max_model_len, engine.max_num_seqs, engine.kv_cache_bytes // model.kv_bytes_per_token,
                     engine.block_size, job.quick)
    serving_steps, corun = 0, None
    if job.path == "cluster":
        from planner.profiler.corun_fit import corun_plan
        from planner.profiler.serving_fit import serving_plan

        corun = corun_plan(engine.max_model_len, engine.max_num_seqs, engine.kv_cache_bytes // model.kv_bytes_per_token,
                           job.quick)
        serving_steps = serving_plan(engine.max_model_len, engine.max_num_seqs, job.quick).cluster_steps + corun.steps
    wide_engine = wide_engine_settings(engine, job)
    wide_steps = (1 + plan.num_points) if wide_engine is not None else 0
    if wide_engine is not None and job.vllm_server:
        from planner.profiler.vllm_server_probe import vllm_server_steps

        wide_steps += vllm_server_steps(engine.max_model_len, engine.max_num_seqs, job.quick)
    total = 1 + plan.num_points + len(plan.transfer_blocks) * len(job.transports) + serving_steps + wide_steps
    # the interpreter's speed over every table, sampled on every core (BENCHMARKS, "The decode step under load")
    with InterpreterSampler(every_core) as interpreter, _progress(job.show_progress) as progress:
        task = progress.add_task("profiling", total=total, last="")

        def advance(label: str, step: bool = True) -> None:
            """One step of the plan done, or (`step` False) a note on the one under way, printed too."""
            progress.update(task, advance=1 if step else 0, last=label)
            if not step:
                progress.console.print(f"note: {label}", markup=False, highlight=False, soft_wrap=True)

        transfers = _measure_transfers(model, job.transports, plan, advance)
        prefill, decode, budget, version = asyncio.run(_measure_engine(engine, plan, advance))
        serving, wide, vllm_server = ServingCosts(), (), None
        if job.path == "cluster":
            serving = _measure_serving(engine, job, model, prefill, decode, transfers, budget, advance)
            serving = _measure_corun(serving, engine, job, corun, advance)
        if wide_engine is not None:
            wide_prefill, wide_decode, _, _ = asyncio.run(_measure_engine(wide_engine, plan, advance))
            wide = (WideEngine(len(parse_cores(wide_engine.cpu_cores)), wide_prefill, wide_decode),)
            if job.vllm_server:
                vllm_server = _measure_vllm_server(wide_engine, job, model, wide_prefill, wide_decode, budget,
                                                   advance)
    cores = (engine.cpu_cores or "any") if job.path == "engine" else "/".join(job.cluster_cores)
    hardware = replace(hardware_info(engine.cpu_cores, engine.model, engine.dtype), machine_ms_start=machine_ms_start,
                       machine_ms_end=speed_check_ms(every_core, product=product), machine_product=product,
                       machine_wake_us_start=wake_us_start, machine_wake_us_end=wake_check_us(every_core),
                       machine_interp_ms=round(interpreter.mean_ms, 4),
                       machine_interp_series_ms=tuple(interpreter_series(
                           interpreter.samples, interpreter.entered_s, interpreter.exited_s).items()),
                       machine_interp_window_s=INTERPRETER_WINDOW_S,
                       machine_interp_start_s=round(interpreter.entered_s, 4))
    profile = Profile(
        hardware=hardware, model=model,
        engine=EngineSettings(vllm_version=version, max_num_batched_tokens=budget, max_num_seqs=engine.max_num_seqs,
                              kv_cache_memory_bytes=engine.kv_cache_bytes, enforce_eager=True),
        prefill=prefill, decode=decode, kv_transfer=transfers,
        created_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        notes=f"pdserve profile --through {job.path}{' --quick' if job.quick else ''}; cores {cores}; "
              + ("colocated vLLM engine" if job.path == "engine"
                 else "engine tables of one colocated engine, serving costs of a 1P+1D cluster")
              + (f"; wide engine on cores {wide_engine.cpu_cores}" if wide_engine is not None else "")
              + ("; vLLM's own server around it" if vllm_server is not None else "")
              + ", prefix caching off",
        serving=serving,
        wide=wide,
        vllm_server=vllm_server,
    )
    job.out.parent.mkdir(parents=True, exist_ok=True)
    save_profile(profile, job.out)
    fit = fit_perf_model(profile)
    from planner.profiler.plot import plot_profile

    plot_path = plot_profile(profile, fit.model, job.out.with_suffix(".png"))
    print_summary(console, profile, fit)
    return ProfileOutcome(profile, fit, job.out, plot_path, time.perf_counter() - started)


def wide_engine_settings(engine: WorkerEngineSettings, job: ProfileJob) -> WorkerEngineSettings | None:
    """The engine of the profile's wide tables: `engine` bound to every core of the cluster's two
    workers; None when the job measures none (path "engine", `wide` off, or one core in all)."""
    if job.path != "cluster" or not job.wide:
        return None
    cores = parse_cores(",".join(job.cluster_cores))
    if len(cores) < 2:
        return None
    return replace(engine, cpu_cores=",".join(map(str, sorted(cores))))


def _measure_transfers(model: ModelInfo, transports: tuple[str, ...], plan: ProfilePlan,
                       advance) -> tuple[TransferSample, ...]:
    geometry = BlockGeometry(model.num_layers, model.num_kv_heads, model.kv_head_dim, model.block_size, model.dtype)
    rows = []
    for transport in transports:
        for m in measure_transfers(geometry, transport, plan.transfer_blocks, plan.transfer_repeats):
            rows.append(TransferSample(m.transport, m.kv_bytes, round(m.transfer_s, 7)))
            advance(f"{transport}: {m.num_blocks} blocks {m.transfer_s * 1e3:.2f} ms")
    return tuple(rows)


async def _on_engine(settings: WorkerEngineSettings, work, seed: int = 0):
    """`await work(engine, probe)` on a colocated engine started from `settings` and its
    `EngineProbe` (`seed`: the probe's token ids), then the engine shut down and collected whatever
    `work` did: one engine up at a time, and AsyncLLM.__del__ (which shuts down again) run now, not at
    interpreter exit. `work`'s result is returned; it must not keep the engine or the probe."""
    from pdserve.engine import start_engine
    from planner.profiler.engine_probe import EngineProbe

    engine, probe = start_engine(settings, "colocated"), None
    try:
        probe = EngineProbe(engine, int(engine.vllm_config.model_config.get_vocab_size()), seed=seed)
        return await work(engine, probe)
    finally:
        engine.shutdown()
        del engine, probe
        gc.collect()


async def _measure_engine(settings: WorkerEngineSettings, plan: ProfilePlan, advance):
    import vllm

    async def tables(engine, probe):
        budget = int(engine.vllm_config.scheduler_config.max_num_batched_tokens)
        advance(f"engine up (token budget {budget})")
        return (*await _measure(probe, plan, budget, advance), budget)

    prefill, decode, budget = await _on_engine(settings, tables)
    if plan.chunked_prompt_tokens:
        prefill += await _measure_chunked(settings, plan, budget, advance)
    return prefill, decode, budget, vllm.__version__


async def _measure_chunked(settings: WorkerEngineSettings, plan: ProfilePlan, budget: int, advance):
    """The plan's chunked rows: its prompts on an engine of the same settings whose token budget is
    `plan.chunked_budget`, each computed in chunks of that many tokens. None (()) where the engine's own
    budget is no larger (its rows are chunked as much already)."""
    if budget <= plan.chunked_budget:
        for _ in range(len(plan.chunked_prompt_tokens) + 1):
            advance(f"chunked rows: the engine's own budget {budget} is no larger than {plan.chunked_budget}")
        return ()

    async def rows(engine, probe):
        advance(f"engine up (token budget {plan.chunked_budget}, for chunked prompts)")
        await probe.warm_up()
        measured = []
        for n in plan.chunked_prompt_tokens:
            seconds = await probe.prefill_s(n, plan.prefill_repeats)
            measured.append(PrefillSample(n, plan.chunked_budget, round(seconds, 7), *_span(probe.last_span_s)))
            advance(f"prefill {n} tokens in {plan.chunked_budget}-token chunks {seconds * 1e3:.1f} ms")
        return tuple(measured)

    return await _on_engine(replace(settings, max_num_batched_tokens=plan.chunked_budget), rows, seed=1)


def _engine_model(engine: WorkerEngineSettings, model: ModelInfo, prefill, decode, budget: int, transfers=()):
    """The fit of the engine tables just measured: the baseline serving costs are measured against."""
    return fit_perf_model(Profile(hardware=hardware_info(engine.cpu_cores), model=model,
                                  engine=EngineSettings(vllm_version="", max_num_batched_tokens=budget,
                                                        max_num_seqs=engine.max_num_seqs,
                                                        kv_cache_memory_bytes=engine.kv_cache_bytes),
                                  prefill=prefill, decode=decode, kv_transfer=transfers)).model


def _measure_serving(engine: WorkerEngineSettings, job: ProfileJob, model: ModelInfo, prefill, decode, transfers,
                     budget: int, advance) -> ServingCosts:
    """The serving costs of a 1P+1D cluster around the engine just measured."""
    from planner.profiler.serving_probe import measure_serving

    return measure_serving(replace(engine, cpu_cores=""), job.transports[0], job.cluster_cores,
                           _engine_model(engine, model, prefill, decode, budget, transfers), decode,
                           model.kv_bytes_per_token, job.quick, advance)


def _measure_corun(serving: ServingCosts, engine: WorkerEngineSettings, job: ProfileJob, plan,
                   advance) -> ServingCosts:
    """`serving` with the co-run stretches of two engines on the cluster's two workers' cores (a
    kind no phase measured is kept at 1, said so)."""
    from planner.profiler.corun_fit import chargeable_stretch, corun_stretches
    from planner.profiler.corun_probe import measure_corun

    measures = measure_corun(engine, job.cluster_cores, plan, advance)
    prompt, step = corun_stretches(measures)

    def shown(measured: float | None) -> str:
        if measured is None:
            return "1x (not measured)"
        kept = chargeable_stretch(measured)
        return f"{measured:.3f}x" if round(measured, 4) == kept else f"{measured:.3f}x (kept as {kept:g}x)"

    def spread(what: str) -> str:
        return ", ".join(f"{m.batch}: {m.ratio:.3f}x ({m.spread[0]:.2f}-{m.spread[1]:.2f})"
                         for m in measures if m.what == what) or "none measured"

    advance(f"co-run: a {plan.prompt_tokens}-token prompt {shown(prompt)} its time alone beside a decoding batch "
            f"(beside a batch of {spread('prompt')}), a decode step {shown(step)} beside prompts (the median over "
            f"batches {spread('decode')}); each the median over cycles (their 10th-90th percentile in brackets) "
            f"of {min((m.beside_steps for m in measures), default=0)}+ steps beside the other engine and "
            f"{min((m.alone_steps for m in measures), default=0)}+ alone", step=False)
    return replace(serving, corun_prefill_stretch=1.0 if prompt is None else chargeable_stretch(prompt),
                   corun_decode_stretch=1.0 if step is None else chargeable_stretch(step))


def _measure_vllm_server(engine: WorkerEngineSettings, job: ProfileJob, model: ModelInfo, prefill, decode,
                         budget: int, advance) -> ServingCosts:
    """vLLM's own server around the wide engine just measured."""
    import json

    from planner.profiler.vllm_server_probe import measure_vllm_server

    vocab_size = int(json.loads((Path(engine.model) / "config.json").read_text())["vocab_size"])
    return measure_vllm_server(engine, _engine_model(engine, model, prefill, decode, budget), decode, vocab_size,
                               job.quick, advance)


async def _measure(probe, plan: ProfilePlan, budget: int, advance):
    """Prefill and decode rows from an `EngineProbe`."""
    await probe.warm_up()
    prefill = []
    for n in plan.prefill_prompt_tokens:
        seconds = await probe.prefill_s(n, plan.prefill_repeats)
        prefill.append(PrefillSample(n, budget, round(seconds, 7), *_span(probe.last_span_s)))
        advance(f"prefill {n} tokens {seconds * 1e3:.1f} ms")
    decode = []
    for batch, context in plan.decode_points:
        m = await probe.decode(batch, context, plan.decode_steps)
        decode.append(DecodeSample(m.batch_size, m.context_tokens, round(m.step_s, 7), *_span((m.start_s, m.end_s))))
        advance(f"decode batch {batch} x {context} tokens {m.step_s * 1e3:.2f} ms/step")
    return await _second_look(probe, plan, prefill, decode, advance)


def _span(span_s: tuple[float, float]) -> tuple[float, float]:
    """When a row was read, as the profile keeps it (to the 0.1 ms)."""
    return round(span_s[0], 4), round(span_s[1], 4)


async def _second_look(probe, plan: ProfilePlan, prefill: list[PrefillSample], decode: list[DecodeSample], advance):
    """`prefill` and `decode` (the rows of `plan`, in its order, from `probe`'s engine) with every
    row off its table's fit measured again (`planner.profiler.second_look`), each such row a note."""
    model = PerfModel(fit_prefill(prefill)[0], fit_decode(decode)[0])

    def noted(point: str, first_s: float, fitted_s: float, again_s: list[float], kept: float) -> None:
        advance(f"second look: {point} {first_s * 1e3:.1f} ms where the table's fit says {fitted_s * 1e3:.1f};"
                f" again {', '.join(f'{s * 1e3:.1f}' for s in again_s)} ms: kept {kept * 1e3:.1f}", step=False)

    fitted = [model.prefill_s(r.prompt_tokens, r.chunk_tokens) for r in prefill]
    for i in rows_off_the_fit([r.prefill_s for r in prefill], fitted):
        row = prefill[i]
        again, spans = [], [(row.start_s, row.end_s)]
        for _ in range(SECOND_LOOKS):
            again.append(await probe.prefill_s(row.prompt_tokens, plan.prefill_repeats))
            spans.append(_span(probe.last_span_s))
        start_s, end_s = kept_span([row.prefill_s, *again], spans)
        prefill[i] = replace(row, prefill_s=round(kept_s(row.prefill_s, again), 7), start_s=start_s, end_s=end_s)
        noted(f"prefill {row.prompt_tokens} tokens", row.prefill_s, fitted[i], again, prefill[i].prefill_s)
    fitted = [model.decode_step_s(r.batch_size, r.context_tokens) for r in decode]
    for i in rows_off_the_fit([r.step_s for r in decode], fitted):
        row, (batch, context) = decode[i], plan.decode_points[i]
        looks = [await probe.decode(batch, context, plan.decode_steps) for _ in range(SECOND_LOOKS)]
        again = [m.step_s for m in looks]
        start_s, end_s = kept_span([row.step_s, *again], [(row.start_s, row.end_s),
                                                          *(_span((m.start_s, m.end_s)) for m in looks)])
        decode[i] = replace(row, step_s=round(kept_s(row.step_s, again), 7), start_s=start_s, end_s=end_s)
        noted(f"decode batch {batch} x {context} tokens", row.step_s, fitted[i], again, decode[i].step_s)
    return tuple(prefill), tuple(decode)
