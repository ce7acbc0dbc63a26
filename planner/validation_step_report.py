"""A validation run's traced engine steps against the model (`bench/validate_planner.py
--step-trace`): the adapter that reads each worker's step and join traces once
(`pdserve.engine_step_trace`), hands them to the pure summaries (`planner.validation_steps`,
`planner.validation_joins`), prints them and returns the dict validation.json keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from pdserve.engine_step_trace import engine_joins, engine_steps
from planner.perf_model import PerfModel, fit_perf_model
from planner.profile import Profile
from planner.validation_joins import client_first_gap_s, handoff_summary, one_step_prompts, prompt_summary
from planner.validation_speed import InterpreterSeries, worker_elasticity
from planner.validation_steps import (client_steady_gap_s, decode_worker_summary, prefill_worker_summary,
                                     prompt_stretch_by_decode_batch)


def model_and_served(profile: Profile) -> tuple[PerfModel, Callable[[int], float]]:
    """The traced steps' yardsticks from `profile`: its fitted model (engine steps) and what the
    simulator adds to a decode step of a batch for serving (its own line, not the table)."""
    return fit_perf_model(profile).model, lambda batch: profile.serving.decode_serving_s(batch, by_batch=False)


def step_report(cluster, trace_dir: Path, result, profile: Profile, console: Console, token_budget: int,
                interpreter: InterpreterSeries | None = None) -> dict:
    """The workers' traced steps over the run's window against `profile` (printed, and a dict for
    validation.json; `planner.validation_steps`): each decode worker's cycle and handoffs (the way
    in over prompts of one step: at most `token_budget` tokens), with `interpreter` (the run's
    series) its steps' elasticity to its core's interpreter (`planner.validation_speed`), and each
    prefill worker's prompt steps."""
    model, served = model_and_served(profile)
    ok = [r for r in result.records if r.ok]
    client_ms = client_steady_gap_s([r.chunk_times_s for r in ok], [r.output_tokens for r in ok]) * 1e3
    window = (result.start_s, result.start_s + result.duration_s)
    report = {"client_steady_gap_ms": round(client_ms, 4) if client_ms == client_ms else None, "workers": {},
              "prefill_workers": {}}

    workers = [*cluster.worker_ids("decode"), *cluster.worker_ids("prefill")]
    traced = {worker_id: engine_steps(trace_dir, worker_id) for worker_id in workers}
    joined = {worker_id: engine_joins(trace_dir, worker_id) for worker_id in workers}

    # the handed-over requests' first gaps only: a hybrid's Local one has no hop and no pull
    first_gap_s = client_first_gap_s([r.chunk_times_s for r in ok
                                      if r.phases is None or r.phases.disaggregated])
    # the prompts each prefill worker computed in one step (a cut one's join stamps its first chunk)
    prefill_joins = [join for worker_id in cluster.worker_ids("prefill")
                     for join in one_step_prompts(joined[worker_id], traced[worker_id])]
    for worker_id in cluster.worker_ids("decode"):
        steps = traced[worker_id]
        summary = report["workers"][worker_id] = decode_worker_summary(steps, *window, model.decode_step_s, served)
        console.print(f"decode worker {worker_id}: clients' steady gap {client_ms:.2f} ms; engine cycle "
                      f"{summary['cycle_ms']} ms = step {summary['step_ms']} (model {summary['model_ms']}) + between "
                      f"{summary['between_ms']}; the simulator charges model + {summary['served_extra_ms']} ms; "
                      f"engine busy {summary['busy_share']}")
        if interpreter is not None and (speed := worker_elasticity(steps, model.decode_step_s, interpreter, worker_id)):
            summary["interpreter_elasticity"] = {key: round(value, 4) for key, value in asdict(speed).items()}
            console.print(f"  its steps against its core's interpreter over {speed.windows} windows of "
                          f"{interpreter.window_s:g} s: elasticity {speed.slope:.2f} (correlation "
                          f"{speed.correlation:.2f}); the slowest third of windows ran the loop "
                          f"{speed.interp_slow_over_fast:.2f}x the fastest and the steps {speed.step_slow_over_fast:.2f}x")
        handoff = summary["handoff"] = handoff_summary(joined[worker_id], steps, *window, first_gap_s, prefill_joins,
                                                               token_budget)
        if handoff["requests"]:
            console.print(f"  handoff, {handoff['requests']} pulled requests (ms): clients' first gap "
                          f"{handoff.get('client_first_gap_ms')} = hops outside {handoff.get('hops_ms')} (the profile's "
                          f"{profile.serving.handoff_s * 1e3:.2f}; the way in's median {handoff.get('hop_in_ms')}) + inside {handoff['inside_ms']}: front end "
                          f"{handoff['front_ms']} (behind the running step {handoff['behind_step_ms']}), pull "
                          f"{handoff['pull_ms']} (steps it spanned {handoff['pull_steps_share']}), to its step "
                          f"{handoff['to_join_ms']}, its step {handoff['join_step_ms']}")
    for worker_id in cluster.worker_ids("prefill"):
        summary = report["prefill_workers"][worker_id] = prefill_worker_summary(traced[worker_id], *window,
                                                                                model.prefill_step_s)
        prompts = summary["prompts"] = prompt_summary(joined[worker_id], *window)
        if summary["steps"]:
            console.print(f"prefill worker {worker_id}: {summary['steps']} prompt steps of {summary['step_ms']} ms "
                          f"(model {summary['model_ms']}), median stretch {summary['median_stretch']}; engine busy "
                          f"{summary['busy_share']}; a prompt's front end {prompts.get('front_ms')} ms, queue "
                          f"{prompts.get('queue_ms')} ms")
        decode_ids = cluster.worker_ids("decode")
        if summary["steps"] and decode_ids and (by_batch := prompt_stretch_by_decode_batch(
                traced[worker_id], traced[decode_ids[0]], *window, model.prefill_step_s)):
            summary["stretch_by_decode_batch"] = by_batch   # against the first decode worker's batch
            console.print(f"  its prompt steps' median stretch by the batch {decode_ids[0]} was decoding: " + ", ".join(
                f"{label}: {row['median_stretch']:.2f} ({row['steps']}"
                + (f"; {row['lost_ms']:+.1f} ms + {row['slope']:.2f}x" if "lost_ms" in row else "") + ")"
                for label, row in by_batch.items()))
    return report
