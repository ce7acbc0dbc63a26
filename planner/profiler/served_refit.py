"""A profile's served step fitted again from what it kept, without measuring again: each batched
run as the profile keeps it (`kept_row`, `kept_window`; `ServingCosts.served_batch_runs`,
`served_batch_windows_s`) and back (`kept_batch_runs`), and the served step's line and table
fitted again from those runs (`refitted`): with the extra by batch (`with_served_table`), netted
for another client placement (`renetted`), or from runs moved to another speed
(`planner.profiler.point_speed`). The fit itself is `planner.profiler.stream_fit`'s. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner.perf_model import PerfModel
from planner.profile import DecodeSample
from planner.profiler.stream_fit import (BatchRun, StreamCpu, fit_served_steps, served_extra_by_batch,
                                         served_residuals_s)
from planner.serving_costs import ServingCosts


def kept_row(run: BatchRun) -> tuple[float, float, float, float]:
    """What a profile keeps of a batched run (`ServingCosts.served_batch_runs`): the inputs of
    `fit_served_steps`, (batch, served step s, context tokens, tokens per s)."""
    return float(run.batch), run.step_s, run.context_tokens, run.tokens_per_s


def kept_window(run: BatchRun) -> tuple[float, float]:
    """When a batched run's step was read (`ServingCosts.served_batch_windows_s`), to the 0.1 ms."""
    return round(run.start_s, 4), round(run.end_s, 4)


def kept_batch_runs(costs: ServingCosts) -> list[BatchRun]:
    """The batched runs a profile's served step was fitted on, as `fit_served_steps` takes them,
    so that a fit of another form can be tried on them without measuring again (the CPU readings
    are not kept: `StreamCpu.of(costs)` holds what was fitted from them), each with its window
    where the profile kept them."""
    windows = costs.served_batch_windows_s or ((0.0, 0.0),) * len(costs.served_batch_runs)
    return [BatchRun(int(batch), step_s, context, tokens_per_s, host_cpu_s=0.0, tokens=0, start_s=start_s, end_s=end_s)
            for (batch, step_s, context, tokens_per_s), (start_s, end_s) in zip(costs.served_batch_runs, windows)]


def with_served_table(costs: ServingCosts, model: PerfModel, engine_rows: Sequence[DecodeSample] = (),
                      engine_cores: float = 1.0) -> ServingCosts:
    """`costs` with `served_step_extra_s` fitted again from the batched runs it kept
    (`kept_batch_runs`), as `pdserve profile` fits it now (the line and every other term as they
    were); `costs` unchanged where it kept no runs. Pure."""
    if not costs.served_batch_runs:
        return costs
    runs = kept_batch_runs(costs)
    residuals = served_residuals_s(runs, model, costs.host_cores, StreamCpu.of(costs), engine_rows, engine_cores,
                                   costs.client_placement)
    return replace(costs, served_step_extra_s=served_extra_by_batch([run.batch for run in runs], residuals))


def renetted(costs: ServingCosts, model: PerfModel, client_placement: str, engine_rows: Sequence[DecodeSample] = (),
             engine_cores: float = 1.0) -> ServingCosts:
    """`costs` with the served step (the line and, where kept, the table) fitted again from the
    batched runs it kept, netted of the host's stretch with the client placed as `client_placement`
    says, and that placement kept (`ServingCosts.client_placement`): what the simulator must charge
    with another placement so that the client's CPU is counted once. Every other term as it was.
    ValueError where the profile kept no runs (it cannot be netted again). Pure."""
    if costs.client_placement == client_placement:
        return costs
    if not costs.served_batch_runs:
        raise ValueError(f"the served step was netted with the client placed {costs.client_placement!r} and no "
                         f"batched runs were kept to net it again for {client_placement!r}")
    return refitted(replace(costs, client_placement=client_placement), model, engine_rows, engine_cores)


def refitted(costs: ServingCosts, model: PerfModel, engine_rows: Sequence[DecodeSample] = (),
             engine_cores: float = 1.0) -> ServingCosts:
    """`costs` with the served step (the line and, where kept, the table) fitted again from the
    batched runs it kept, against `model` and `engine_rows` (the engine table the runs are set
    against), netted with the client placed as `costs.client_placement` says. Every other term as
    it was; `costs` unchanged where it kept no runs. Pure."""
    if not costs.served_batch_runs:
        return costs
    runs = kept_batch_runs(costs)
    stream = StreamCpu.of(costs)
    step_s, per_token_s, _ = fit_served_steps(runs, model, costs, engine_rows=engine_rows, stream=stream,
                                              engine_cores=engine_cores, client_placement=costs.client_placement)
    table = served_extra_by_batch([run.batch for run in runs], served_residuals_s(
        runs, model, costs.host_cores, stream, engine_rows, engine_cores, costs.client_placement))
    return replace(costs, decode_step_s=step_s, decode_cpu_s_per_token=per_token_s,
                   served_step_extra_s=table if costs.served_step_extra_s else ())
