"""`pdserve profile --quick --through cluster` on the tiny model: a real engine, real transports, a
real 1P+1D cluster for the serving costs and the engine again over both cores, one short run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from planner.perf_model import fit_perf_model
from pdserve.dtype_probe import cached_decision
from pdserve.engine import native_dtype
from planner.profile import DTYPE_BYTES, load_profile
from planner.profiler.corun_fit import chargeable_stretch
from planner.profiler.plan import make_plan
from planner.serving_costs import CORUN_RANGE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def quick_profile(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tiny.json"
    env = os.environ | {"VLLM_LOGGING_LEVEL": "WARNING"}
    run = subprocess.run([sys.executable, "-m", "cli.main", "profile", "--model", str(tiny_model), "--quick",
                          "--transports", "tcp,torch", "--kv-cache-mb", "64", "--through", "cluster", "--no-progress",
                          "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out, run.stdout


def test_quick_profile_records_the_tiny_model_and_the_measured_tables(quick_profile, tiny_model):
    path, stdout = quick_profile
    profile = load_profile(path)
    assert profile.model.name == "tiny"
    # `--dtype auto` as `pdserve up` resolves it: the probe's decision for one worker's core (cached
    # by the profile's run), which is not the CPU flags' guess on every host kind (float32 on an
    # AVX512-BF16 Xeon without AMX); the flags' guess only when the probe could not run
    decision = cached_decision(str(tiny_model), "0")
    dtype = decision.dtype if decision is not None else native_dtype()
    assert profile.model.dtype == dtype
    assert profile.hardware.dtype_choice.startswith(f"dtype {dtype}:")
    # K+V x 4 layers x 2 KV heads x 64 x the dtype's bytes
    assert profile.model.kv_bytes_per_token == 2 * 4 * 2 * 64 * DTYPE_BYTES[dtype]
    assert profile.hardware.num_cores == 1 and profile.hardware.device == "cpu"
    assert profile.engine.kv_cache_memory_bytes == 64 << 20 and profile.engine.max_num_batched_tokens > 0
    # to the ends of the ranges the planner is asked about: the longest prompt (max_model_len 2048 less
    # the one token to generate), max_num_seqs, the longest context (where the 64 MiB KV cache holds it)
    assert [r.prompt_tokens for r in profile.prefill] == [32, 256, 1024, 2047]
    # every decode point of the plan the KV cache holds: which contexts fit depends on the dtype
    # (float32 on AVX2-only hosts halves the tokens 64 MiB holds)
    plan = make_plan(2048, 64, profile.engine.kv_cache_memory_bytes // profile.model.kv_bytes_per_token,
                     profile.model.block_size, quick=True)
    assert sorted({r.batch_size for r in profile.decode}) == [1, 4, 16, 64]
    assert len(profile.decode) == len(plan.decode_points) >= 12
    assert max(r.context_tokens / r.batch_size for r in profile.decode) > 2000
    # the shortest context is the serving probe's prompts, 16 tokens + the steps' mean output
    assert min(r.context_tokens / r.batch_size for r in profile.decode) < 32
    assert profile.transports == ("tcp", "torch")
    assert sorted(r.kv_bytes for r in profile.kv_transfer if r.transport == "tcp") == [
        profile.model.kv_bytes_per_block, 64 * profile.model.kv_bytes_per_block]  # 1 block, 2048 tokens
    assert path.with_suffix(".png").stat().st_size > 10_000
    assert "MAPE" in stdout and "wrote" in stdout
    # every engine row keeps when it was read, inside the interpreter series the profile kept
    series_start = profile.hardware.machine_interp_start_s
    series_end = series_start + profile.hardware.machine_interp_window_s * max(
        len(values) for _, values in profile.hardware.machine_interp_series_ms)
    for row in (*profile.prefill, *profile.decode):
        assert series_start <= row.start_s < row.end_s <= series_end, row


def test_quick_profile_fits_are_sane(quick_profile):
    profile = load_profile(quick_profile[0])
    prefill_s = [r.prefill_s for r in sorted(profile.prefill, key=lambda r: r.prompt_tokens)]
    assert prefill_s[-1] > 2 * prefill_s[0]  # the longest prompt costs more than 32 tokens
    # each longer prompt costs about as much or more than the one before: a VM's speed swings (2x
    # within a minute on an AMX Xeon once: 1,024 tokens 147 ms, then 2,047 tokens 143 ms) can turn
    # two rows around, never by half; the fitted model below is increasing either way
    assert all(later > 0.5 * earlier for earlier, later in zip(prefill_s, prefill_s[1:])), prefill_s
    assert max(r.step_s for r in profile.decode) < 0.5  # a tiny-model step is milliseconds, never seconds
    fit = fit_perf_model(profile)
    model = fit.model
    assert model.prefill_s(1024, 2048) > model.prefill_s(32, 2048) > 0
    assert model.decode_step_s(16, 16 * 512) > model.decode_step_s(1, 512) > 0
    for transport in ("tcp", "torch"):
        assert model.transfer_s(16 << 20, transport) > model.transfer_s(64 << 10, transport) > 0
    assert fit.prefill_mape < 0.25 and fit.decode_mape < 0.35


def test_the_cluster_pass_measures_what_serving_adds_around_the_engines(quick_profile):
    serving = load_profile(quick_profile[0]).serving
    # The latencies are residuals over an engine table measured a minute earlier, net of the CPU
    # terms: on a shared host whose speed moves they can be 0, so only their scale is asserted.
    # The CPU terms come from /proc and must be there: every request costs the prefill worker's
    # API process, and every streamed token the router and the client, some CPU.
    assert 0 <= serving.first_token_s < 0.1
    # the Decode call's way in is traced on the lone requests (the prefill engine's step to the decode
    # worker's front end: a gRPC hop, never 0); what an idle decode engine adds beyond the simulator's
    # pull and step is the rest of the handoff
    assert 0 < serving.handoff_s < 0.1 and 0 <= serving.idle_join_s < 0.1
    assert "to an idle decode engine" in " ".join(quick_profile[1].split())   # the console wraps its lines
    assert 0 < serving.prefill_cpu_s_per_request < 0.05
    # streamed tokens are read while every request of a batch streams, per step and per token (either
    # may fit to 0, not both): at a batch of 16 a token costs the router and the client at least
    # 10 us (a fit that collapsed to ~0 fails here)
    assert serving.host_cpu_s_per_token + serving.host_cpu_s_per_step / 16 > 1e-5
    assert serving.host_cpu_s_per_token < 0.005 and serving.host_cpu_s_per_step < 0.05
    assert "ms/step" in quick_profile[1]
    # each batched run keeps when its settled window was (what `point_speed` sets against the series)
    assert len(serving.served_batch_windows_s) == len(serving.served_batch_runs) > 0
    assert all(0 < start_s < end_s for start_s, end_s in serving.served_batch_windows_s)
    # what serving adds to a decode step of 24 is milliseconds, not seconds
    assert serving.decode_step_s + 24 * serving.decode_cpu_s_per_token < 0.1 and serving.decode_cpu_s_per_token < 0.005
    assert serving.host_cores == len(os.sched_getaffinity(0))
    assert "serving: first token +" in quick_profile[1]


def test_the_cluster_pass_measures_a_prompt_step_beside_decode_streams(quick_profile):
    # lone prompts of four lengths idle and beside 8 streams (a quick plan's one level), read off the
    # prefill engine's trace: at least one batch of streams gives a row over idle, keyed by its bucket's smallest batch
    rows = load_profile(quick_profile[0]).serving.prompt_loss_by_batch
    assert rows and all(batch in (1, 2, 4, 8, 16, 32, 64) for batch, _, _ in rows)
    assert all(stretch < 10 and lost_s < 1.0 for _, stretch, lost_s in rows)   # a slowdown, not a broken read
    assert "a prompt step beside decode streams" in " ".join(quick_profile[1].split())
    # and the idle fit those rows are over, which the simulator charges to the step as measured; the
    # part of the first token's latency it is, no more than that latency
    serving = load_profile(quick_profile[0]).serving
    stretch, lost_s = serving.prompt_idle_loss
    assert 1.0 <= stretch < 10 and 0 <= lost_s < 1.0
    assert 0 <= serving.first_token_idle_excess_s <= serving.first_token_s
    assert "a prompt step with the decode worker idle" in " ".join(quick_profile[1].split())
    # the decode side of the same windows: the streams' steps beside the probes' prompts, or a note
    # that too few ran beside one (the quick plan's two repeats)
    served, report = load_profile(quick_profile[0]).serving.corun_decode_stretch_served, " ".join(quick_profile[1].split())
    if served:
        assert CORUN_RANGE[0] <= served <= CORUN_RANGE[1]
        assert f"a decode step beside a prompt, through the cluster and net of the host model: {served:g}x" in report
        assert "ms a step beside a prompt" in report
    else:
        assert "too few decode steps beside the probes' prompts" in report
    # a request's first decode steps over its own steady step, read off the decode engine's trace at
    # the CPU runs' prompts and the long ones: milliseconds in all, never negative
    serving = load_profile(quick_profile[0]).serving
    assert re.search(r"a request's first decode steps, 12\d-token context: [1-4] runs", report)
    assert serving.join_warmup_s >= 0 and serving.join_warmup_s_per_context_token >= 0
    assert serving.join_warmup_cost_s(1024) < 0.05


def test_the_engine_is_measured_again_over_both_cluster_cores(quick_profile):
    profile = load_profile(quick_profile[0])
    assert [engine.devices for engine in profile.wide] == [2]
    wide = profile.wide[0]
    # the same points as the one-core tables, so the planner compares like with like
    assert [r.prompt_tokens for r in wide.prefill] == [r.prompt_tokens for r in profile.prefill]
    assert [r.batch_size for r in wide.decode] == [r.batch_size for r in profile.decode]
    model = fit_perf_model(profile).model
    assert model.widths == (1, 2)
    assert model.on_devices(2).prefill_s(1024, 2048) > model.on_devices(2).prefill_s(32, 2048) > 0
    assert "wide engine on cores 0,1" in profile.notes and "[one engine on 2 devices]" in quick_profile[1]


def test_the_cluster_pass_measures_two_engines_on_the_workers_cores_together(quick_profile):
    serving = load_profile(quick_profile[0]).serving
    # each phase set steps beside the other engine against steps alone, cycle by cycle: the note says
    # how many of each the thinnest phase had, and each figure's cycles' spread
    note = " ".join(next(line for line in quick_profile[1].splitlines() if line.startswith("note: co-run: a ")).split())
    counts = re.search(r"of (\d+)\+ steps beside the other engine and (\d+)\+ alone", note)
    assert counts and min(int(counts[1]), int(counts[2])) >= 1, note
    assert re.search(r"batches 16: [\d.]+x \([\d.]+-[\d.]+\)", note), note   # the quick plan's one decode batch
    # the ratios the simulator charges are the ones measured (or the range's bound, said so), and
    # the report prints what the profile keeps. How large they are is the host's business: SMT
    # siblings sold as two vCPUs slow each other by up to 2x, and a CI host has measured 2.5x.
    stretches = (serving.corun_prefill_stretch, serving.corun_decode_stretch)
    assert all(CORUN_RANGE[0] <= stretch <= CORUN_RANGE[1] for stretch in stretches)
    measured = (re.search(r"prompt ([\d.]+)x its time alone", note), re.search(r"a decode step ([\d.]+)x beside", note))
    assert all(measured), note
    for shown, kept in zip(measured, stretches):
        assert kept == pytest.approx(chargeable_stretch(float(shown[1])), abs=6e-4), note
    assert (f"engines on the two workers' cores together: a prompt {stretches[0]:.3f}x its time alone, "
            f"a decode step {stretches[1]:.3f}x") in " ".join(quick_profile[1].split())   # the report wraps lines
