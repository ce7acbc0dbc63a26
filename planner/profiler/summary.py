"""What `pdserve profile` prints when it is done: each measured row against its fit, the fitted
forms and their errors, the machine's checks, and the serving terms (`planner.serving_costs`)."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table

from loadgen.comparison.host_speed import drift_note, wake_note
from loadgen.host_probe import series_spread
from planner.perf_model import FitReport, PerfModel
from planner.profile import DecodeSample, Profile
from planner.profiler.spread import spread_summary
from planner.profiler.served_refit import kept_batch_runs
from planner.profiler.stream_fit import served_step_error
from planner.serving_costs import ServingCosts


def print_summary(console: Console, profile: Profile, fit: FitReport) -> None:
    """The profile as `pdserve profile` prints it when done: each table row against its fit, the
    fitted forms, the machine checks, and what serving adds."""
    table = Table(title=f"profile of {profile.model.name} on {profile.hardware.num_cores} x {profile.hardware.cpu_model}")
    for column in ("phase", "point", "measured ms", "fitted ms", "error"):
        table.add_column(column, justify="right" if column != "phase" else "left")
    m = fit.model
    for row in profile.prefill:
        point = f"{row.prompt_tokens} tokens" + (f" in {row.chunk_tokens}-token chunks" if row.num_chunks > 1 else "")
        _row(table, "prefill", point, row.prefill_s, m.prefill_s(row.prompt_tokens, row.chunk_tokens))
    for row in profile.decode:
        _row(table, "decode step", f"batch {row.batch_size}, context {row.context_tokens}", row.step_s,
             m.decode_step_s(row.batch_size, row.context_tokens))
    for row in profile.kv_transfer:
        _row(table, f"kv {row.transport}", f"{row.kv_bytes / 1e6:.2f} MB", row.transfer_s,
             m.transfer_s(row.kv_bytes, row.transport))
    console.print(table)
    for line in fit.lines():
        console.print("  " + line, markup=False)
    if note := drift_note(profile.hardware.machine_ms_start, profile.hardware.machine_ms_end,
                          product=profile.hardware.machine_product):
        console.print("  " + note, markup=False)
    if note := wake_note(profile.hardware.machine_wake_us_start, profile.hardware.machine_wake_us_end):
        console.print("  " + note, markup=False)
    if profile.hardware.machine_interp_ms:
        spread = series_spread(series for _, series in profile.hardware.machine_interp_series_ms)
        windows = (f"; its {profile.hardware.machine_interp_window_s:g} s windows {spread[0]:.3f}-{spread[1]:.3f} ms "
                   f"(p10-p90, {spread[1] / spread[0]:.2f}x)") if spread else ""
        console.print(f"  interpreter: {profile.hardware.machine_interp_ms:.3f} ms of CPU a check loop, the mean over "
                      f"the profile on every core{windows} (a validation run compares its own with it)", markup=False)
    serving = profile.serving
    if serving != ServingCosts():
        console.print(f"  serving: first token +{serving.first_token_s * 1e3:.2f} ms, handoff +{serving.handoff_s * 1e3:.2f} ms"
                      f" (+{serving.idle_join_s * 1e3:.2f} ms to an idle decode engine),"
                      f" decode step +{serving.decode_step_s * 1e3:.2f} ms;"
                      f" decode worker CPU {serving.decode_cpu_s_per_token * 1e6:.0f} us/token"
                      f" + {serving.decode_cpu_s_per_request * 1e3:.2f} ms/request, prefill worker CPU"
                      f" {serving.prefill_cpu_s_per_request * 1e3:.2f} ms/request; host (router, client)"
                      f" {serving.host_cpu_s_per_token * 1e6:.0f} us/token + {serving.host_cpu_s_per_step * 1e3:.2f} ms/step"
                      f" + {serving.host_cpu_s_per_request * 1e3:.2f} ms/request on {serving.host_cores} cores (the router's"
                      f" part {serving.router_cpu_s_per_token * 1e6:.0f} us/token + {serving.router_cpu_s_per_step * 1e3:.2f}"
                      f" ms/step + {serving.router_cpu_s_per_request * 1e3:.2f} ms/request)", markup=False)
        if prompt_cpu := serving_prompt_cpu_line(serving):
            console.print("  " + prompt_cpu, markup=False)
        served_corun = (f"; through the cluster, beside the prompt-loss probes' prompts and net of the host model, "
                        f"{serving.corun_decode_stretch_served:.3f}x (what the simulator charges)"
                        if serving.corun_decode_stretch_served else "")
        console.print(f"  engines on the two workers' cores together: a prompt {serving.corun_prefill_stretch:.3f}x its"
                      f" time alone, a decode step {serving.corun_decode_stretch:.3f}x{served_corun}", markup=False)
        if serving.join_warmup_measured:
            console.print(f"  a request's first decode steps over its steady step, in all: {serving.join_warmup_s * 1e3:.2f} ms"
                          f" + {serving.join_warmup_s_per_context_token * 1e6:.2f} us x context (`--join-warmup profile`"
                          f" spreads it over the steps after the join)", markup=False)
        if line := served_step_line(serving, m, profile.decode):
            console.print("  " + line, markup=False)
        if serving.prompt_idle_loss:
            stretch, lost_s = serving.prompt_idle_loss
            console.print(f"  a prompt step with the decode worker idle: {stretch:.2f}x the engine's + {lost_s * 1e3:.1f} ms "
                          f"(of the first token's +{serving.first_token_s * 1e3:.2f} ms, "
                          f"{serving.first_token_idle_excess_s * 1e3:.2f} ms at the lone prompts), charged to the step",
                          markup=False)
        if serving.prompt_loss_by_batch:
            console.print("  a prompt step beside decode streams, over the same step with the decode worker idle: "
                          + ", ".join(f"{batch:g}+ streams {stretch:.2f}x + {lost_s * 1e3:.1f} ms"
                                      for batch, stretch, lost_s in serving.prompt_loss_by_batch), markup=False)
        for name, spread in (("first token", serving.first_token_spread_s), ("decode step", serving.decode_step_spread_s)):
            if spread:
                console.print(f"  spread of the {name} around its median: {spread_summary(spread)}", markup=False)
    if (server := profile.vllm_server) is not None:
        console.print(f"  vLLM's own server around the wide engine: first token +{server.first_token_s * 1e3:.2f} ms,"
                      f" decode step +{server.decode_step_s * 1e3:.2f} ms + {server.decode_cpu_s_per_token * 1e6:.0f}"
                      " us/token of the batch", markup=False)
        if profile.wide and (line := served_step_line(server, dict(m.wide)[profile.wide[0].devices], profile.wide[0].decode,
                                                      server.host_cores or profile.wide[0].devices)):
            console.print("  vLLM's server: " + line, markup=False)


def _row(table: Table, phase: str, point: str, measured_s: float, fitted_s: float) -> None:
    table.add_row(phase, point, f"{measured_s * 1e3:.3f}", f"{fitted_s * 1e3:.3f}",
                  f"{(fitted_s - measured_s) / measured_s:+.1%}")


def served_step_line(serving: ServingCosts, model: PerfModel, engine_rows: Sequence[DecodeSample],
                     engine_cores: float = 1.0) -> str:
    """What serving adds to the decode step at each batch measured, how far each form charges the
    runs it was measured on (`stream_fit.served_step_error`), and where the host model placed the
    client when it netted them (`ServingCosts.client_placement`), or "" where no table was kept."""
    if not (serving.served_step_extra_s and serving.served_batch_runs):
        return ""
    runs = kept_batch_runs(serving)
    table = served_step_error(runs, model, serving, True, engine_rows, engine_cores)
    line = served_step_error(runs, model, serving, False, engine_rows, engine_cores)
    points = ", ".join(f"b{batch:g} +{extra_s * 1e3:.2f}" for batch, extra_s in serving.served_step_extra_s)
    return (f"served decode step over the engine's, by batch (ms): {points}; the line {serving.decode_step_s * 1e3:.2f}"
            f" ms + {serving.decode_cpu_s_per_token * 1e6:.0f} us x batch misses these runs by {line:.1%} on average,"
            f" the table interpolated by {table:.1%} (the simulator charges the line; `--served-step table` the table);"
            f" netted of the host's stretch with the client placed {serving.client_placement!r}, as the simulator"
            f" places it")


def serving_prompt_cpu_line(serving: ServingCosts, per_tokens: int = 1000) -> str:
    """What `per_tokens` more prompt tokens cost each process in CPU, or "" where nothing was measured."""
    terms = (("prefill worker", serving.prefill_cpu_s_per_prompt_token),
             ("decode worker", serving.decode_cpu_s_per_prompt_token),
             ("host", serving.host_cpu_s_per_prompt_token), ("router", serving.router_cpu_s_per_prompt_token))
    if not any(value for _, value in terms):
        return ""
    return (f"serving CPU per {per_tokens} prompt tokens: "
            + ", ".join(f"{name} +{value * per_tokens * 1e3:.2f} ms" for name, value in terms)
            + " (the router's part of the host's)")
