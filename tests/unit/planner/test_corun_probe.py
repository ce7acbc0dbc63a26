"""The co-run probe's pure parts: its plan within the engine's limits, and the stretches read off two
engines' traced steps, cycle by cycle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdserve.engine_step_trace import TracedStep
from planner.profile import load_profile, profile_from_dict, profile_to_dict, save_profile
from planner.profiler.corun_fit import (CorunMeasure, chargeable_stretch, corun_plan, corun_stretches, decode_corun,
                                       decode_runs, phase_cycles, prompt_corun, window_s)
from planner.profiles.example import build_example_profile


def decode_step(start_s: float, seconds: float, batch: int = 4, joined: int = 0) -> TracedStep:
    return TracedStep(start_s, start_s + seconds, joined, batch - joined, batch, batch - joined, batch * 100)


def prompt_step(start_s: float, seconds: float, tokens: int = 1024) -> TracedStep:
    return TracedStep(start_s, start_s + seconds, 1, 0, tokens, 0, tokens)


def alternating_prompts(start_s: float, cycles: int, window: float, prompt_s: float) -> list[TracedStep]:
    """Prompts back to back (1 ms apart) through the first `window` of each cycle of 2 x `window`."""
    steps = []
    for k in range(cycles):
        t = start_s + 2 * window * k
        while t + prompt_s <= start_s + 2 * window * k + window:
            steps.append(prompt_step(t, prompt_s))
            t += prompt_s + 0.001
    return steps


def test_a_decode_step_is_beside_when_the_prompt_engine_stepped_throughout_and_alone_when_through_none():
    # windows of 0.5 s: prompts of 0.1 s in the first half of each 1 s cycle; decode steps of 10 ms
    # alone and 12 ms beside, every 15 ms, so some straddle a prompt's edge and count for neither
    prompts = alternating_prompts(100.0, cycles=4, window=0.5, prompt_s=0.1)
    decode = []
    t = 100.0
    while t < 104.0:
        covered = any(p.start_s <= t and t + 0.012 <= p.end_s for p in prompts)
        decode.append(decode_step(t, 0.012 if covered else 0.010))
        t += 0.015
    decode.append(decode_step(100.2, 0.5, batch=4, joined=4))   # a batch starting again: a join, never counted
    decode.append(decode_step(100.7, 0.5, batch=2))               # another batch than the phase's: not counted
    measure = decode_corun(decode, prompts, start_s=100.0, cycle_s=1.0, cycles=4, batch=4)
    assert measure.what == "decode" and measure.batch == 4
    assert measure.ratio == pytest.approx(1.2) and measure.spread == pytest.approx((1.2, 1.2))
    assert len(measure.cycle_ratios) == 4 and measure.beside_steps > 80 and measure.alone_steps > 100
    # steps before the first cycle or after the last are the phase's edges: left out
    assert decode_corun(decode, prompts, 100.0, 1.0, cycles=2, batch=4).alone_steps < measure.alone_steps


def test_each_cycle_is_its_own_ratio_so_a_host_slowing_between_cycles_moves_both_sides():
    # cycle 1 at full speed (10 ms alone, 11 beside), cycles 2-4 on a host 1.5x slower (15 and 16.5):
    # one ratio of all the steps' medians would say 16.5 / 10 or 15 / 11 depending on the mix; each cycle says 1.1
    prompts = alternating_prompts(0.0, cycles=4, window=0.5, prompt_s=0.5)
    decode = []
    for k in range(4):
        slow = 1.0 if k == 0 else 1.5
        decode += [decode_step(k + 0.05 + 0.02 * i, 0.011 * slow) for i in range(20)]        # beside
        decode += [decode_step(k + 0.55 + 0.02 * i, 0.010 * slow) for i in range(20)]        # alone
    measure = decode_corun(decode, prompts, 0.0, 1.0, 4, batch=4)
    assert measure.cycle_ratios == pytest.approx((1.1,) * 4) and measure.ratio == pytest.approx(1.1)


def test_a_cycle_without_steps_of_both_kinds_does_not_count_and_a_phase_without_any_is_an_error():
    prompts = alternating_prompts(0.0, cycles=2, window=0.5, prompt_s=0.5)
    decode = ([decode_step(0.05 + 0.02 * i, 0.012) for i in range(20)] + [decode_step(0.55 + 0.02 * i, 0.010) for i in range(20)]
              + [decode_step(1.05 + 0.02 * i, 0.012) for i in range(20)])   # cycle 2 has no step alone
    measure = decode_corun(decode, prompts, 0.0, 1.0, 2, batch=4)
    assert measure.cycle_ratios == pytest.approx((1.2,)) and (measure.beside_steps, measure.alone_steps) == (20, 20)
    with pytest.raises(ValueError, match="decode phase \\(batch 16\\) had no cycle with 3\\+ steps both beside"):
        decode_corun(decode, prompts, 0.0, 1.0, 2, batch=16)


def test_a_prompt_is_beside_within_one_run_of_decode_steps_and_alone_where_none_overlaps():
    # the decode engine steps 8 ms with 2 ms between (its own work: still decoding) through the first
    # 0.6 s of each 1.2 s cycle; prompts of 0.1 s back to back, 0.12 s beside, 0.1 alone
    decode = [decode_step(k * 1.2 + 0.01 * i, 0.008, batch=16) for k in range(3) for i in range(60)]
    runs = decode_runs(decode)
    assert len(runs) == 3 and runs[0] == pytest.approx((0.0, 0.598))
    prompts = []
    for k in range(3):
        t = k * 1.2
        while t < k * 1.2 + 1.2:
            within = t < k * 1.2 + 0.598   # the last of these runs past the decoding: neither
            prompts.append(prompt_step(t, 0.12 if within else 0.1))
            t = prompts[-1].end_s + 0.001
    prompts.append(TracedStep(0.2, 0.3, 0, 1, 512, 0, 1024))   # a chunk continuing a prompt: not a prompt's first step
    measure = prompt_corun(prompts, decode, 0.0, 1.2, 3, batch=16)
    assert measure.what == "prompt" and measure.ratio == pytest.approx(1.2)
    assert len(measure.cycle_ratios) == 3 and measure.beside_steps == 12 and measure.alone_steps >= 12
    # a gap longer than a run allows ends the run: a prompt across it is neither beside nor alone
    assert len(decode_runs(decode, max_gap_s=0.0)) == len(decode)


def test_the_windows_hold_a_few_prompts_and_never_less_than_the_floor():
    assert window_s(0.02) == 0.3 and window_s(0.5) == pytest.approx(1.0)


def test_the_profile_keeps_the_prompt_phases_ratio_and_the_median_over_the_decode_batches():
    measures = [CorunMeasure("decode", 1, (1.10, 1.12, 1.30), 50, 50), CorunMeasure("decode", 4, (1.0, 1.05), 50, 50),
                CorunMeasure("decode", 16, (0.95,), 50, 50), CorunMeasure("prompt", 16, (1.02, 1.04, 1.03), 9, 9)]
    prompt, step = corun_stretches(measures)
    assert prompt == pytest.approx(1.03) and step == pytest.approx(1.025)   # batches: 1.12, 1.025, 0.95
    # a kind no phase measured is None (the profile keeps 1 and says so), not a made-up ratio
    assert corun_stretches(measures[:3]) == (None, pytest.approx(1.025))
    assert corun_stretches([]) == (None, None)
    assert measures[0].spread[0] == pytest.approx(1.104) and "3 of them" in measures[0].shown()


def test_a_stretch_outside_what_two_engines_can_do_is_kept_at_the_bound():
    assert chargeable_stretch(1.06234) == 1.0623
    assert chargeable_stretch(0.2) == 0.5 and chargeable_stretch(9.0) == 4.0
    # what is kept is always a stretch the profile accepts
    example = build_example_profile()
    for measured in (0.01, 0.97, 2.49, 50.0):
        replace(example.serving, corun_prefill_stretch=chargeable_stretch(measured))


def test_the_plan_keeps_within_the_context_the_batch_cap_and_the_kv_cache():
    full = corun_plan(4096, 64, kv_tokens=100_000, quick=False)
    assert (full.prompt_tokens, full.decode_batches, full.prompt_batch, full.cycles, full.phase_s) == (1024, (1, 4, 16), 16, 12, 15.0)
    assert phase_cycles(full, window=0.3) == 25 and phase_cycles(full, window=2.0) == 12   # 15 s, or 12 cycles
    assert (full.hold_context_tokens, full.hold_tokens) == (64, 512)
    assert full.phases == (("decode", 1), ("decode", 4), ("decode", 16), ("prompt", 16)) and full.steps == 5
    quick = corun_plan(4096, 64, kv_tokens=100_000, quick=True)
    assert (quick.prompt_tokens, quick.decode_batches, quick.cycles, quick.steps) == (256, (16,), 4, 3)
    short = corun_plan(512, 4, kv_tokens=100_000, quick=False)
    assert short.prompt_tokens == 511 and short.decode_batches == (1, 4) and short.prompt_batch == 4
    assert short.hold_context_tokens + short.hold_tokens < 512
    # a KV cache of 4,096 tokens holds 16 held requests of 64 + 191 tokens, no more: none is preempted
    small = corun_plan(4096, 64, kv_tokens=4096, quick=False)
    assert small.prompt_batch * (small.hold_context_tokens + small.hold_tokens + 1) <= 4096


def test_the_stretches_round_trip_and_an_older_profile_reads_as_engines_that_do_not_slow_each_other(tmp_path):
    example = build_example_profile()
    measured = replace(example, serving=replace(example.serving, corun_prefill_stretch=1.062,
                                                corun_decode_stretch=1.031))
    save_profile(measured, tmp_path / "corun.json")
    assert load_profile(tmp_path / "corun.json") == measured
    older = profile_to_dict(measured)
    for key in ("corun_prefill_stretch", "corun_decode_stretch"):
        older["serving"].pop(key)
    serving = profile_from_dict(older).serving
    assert (serving.corun_prefill_stretch, serving.corun_decode_stretch) == (1.0, 1.0)


def test_an_engine_that_exits_before_it_connects_is_named_at_once(tmp_path):
    import socket
    import subprocess
    import time

    from planner.profiler.corun_probe import _accept

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "probe.sock"))
    server.listen(2)
    server.settimeout(0.1)
    processes = {"prompt": subprocess.Popen(["false"]), "decode": subprocess.Popen(["sleep", "30"])}
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="the co-run probe's prompt engine exited before it connected"):
            _accept(server, processes)
        assert time.monotonic() - started < 30
    finally:
        processes["decode"].kill()
        processes["decode"].wait()
        server.close()


def test_a_side_that_exits_mid_measurement_is_an_error_not_a_hang():
    import socket

    from planner.profiler.corun_probe import _Peer

    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(b'{"seconds": 0.5}\n{"seco')
        peer = _Peer("decode", ours, exit_code=lambda: None)
        assert peer.recv(timeout_s=5) == {"seconds": 0.5}
        peer.exit_code = lambda: -9
        with pytest.raises(RuntimeError, match="decode engine exited \\(-9\\)"):
            peer.recv(timeout_s=5)
    finally:
        ours.close()
        theirs.close()


def test_a_side_starts_under_its_own_cores_binding_and_not_the_one_an_engine_of_the_profiler_left_behind():
    """The profiler's one-core engine sets OMP_PLACES etc. in its own process; a side started after it
    on the other core must not inherit them (libgomp, preloaded, rejects places outside its cores):
    it starts under its own core's, as its engine's processes need them, so its engine core forks."""
    from dataclasses import replace

    from pdserve.engine import EngineSettings, engine_process_env, engine_start_env
    from pdserve.engine_process import started_under

    left = {"OMP_PLACES": "{0}", "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
            "PATH": "/usr/bin"}
    side = replace(EngineSettings(model="m", executor="uni"), cpu_cores="1", preload=())
    env = engine_start_env(side, left, gpu=False)   # what measure_corun starts each side under
    assert env["PATH"] == "/usr/bin"
    assert (env["OMP_PLACES"], env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("{1}", "1", "1")
    # the environment its engine asks for once started, so start_engine forks the engine core
    assert started_under(engine_process_env(side, dict(env), gpu=False), env)
