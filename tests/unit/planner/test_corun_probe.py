"""The co-run probe's pure parts: its plan within the engine's limits, and the stretches from rounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.profile import load_profile, profile_from_dict, profile_to_dict, save_profile
from planner.profiler.corun_fit import (CorunRound, chargeable_stretch, corun_plan, corun_stretches,
                                       more_rounds_needed, steady_round)
from planner.profiles.example import build_example_profile


def test_the_stretches_are_the_median_over_rounds_of_together_over_alone():
    rounds = [CorunRound(1.0, 1.10, 0.020, 0.021), CorunRound(2.0, 2.04, 0.020, 0.030),
              CorunRound(1.0, 1.06, 0.010, 0.0105)]
    prompt, step = corun_stretches(rounds)
    assert prompt == pytest.approx(1.06) and step == pytest.approx(1.05)


def test_a_round_compares_together_with_the_mean_of_the_alones_around_it():
    # prompt alone 1.0 s before and 1.1 after, 1.26 together; decode 20 ms, 22 ms, 21 ms together
    r = CorunRound(1.0, 1.26, 0.020, 0.021, prompt_alone_after_s=1.1, step_alone_after_s=0.022)
    assert r.prompt_ratio == pytest.approx(1.2) and r.step_ratio == pytest.approx(1.0)
    assert steady_round(r)   # each kind's alones within 15% of each other
    older = CorunRound(1.0, 1.26, 0.020, 0.021)   # no second alones (an older probe's round): the first alone
    assert older.prompt_ratio == pytest.approx(1.26) and steady_round(older)


def test_a_round_the_hosts_speed_moved_in_does_not_count_and_more_are_measured():
    steady = CorunRound(1.0, 1.02, 0.020, 0.0205, prompt_alone_after_s=1.01, step_alone_after_s=0.0198)
    # the VM slowed during the together measurements and stayed slow: the prompt's alones 1.0 then 1.5
    drifted = CorunRound(1.0, 1.6, 0.020, 0.021, prompt_alone_after_s=1.5, step_alone_after_s=0.020)
    slow_step = CorunRound(1.0, 1.0, 0.020, 0.030, prompt_alone_after_s=1.0, step_alone_after_s=0.0235)
    assert not steady_round(drifted) and not steady_round(slow_step)   # 50% and 17.5% apart
    assert steady_round(drifted, tolerance=0.6)
    # the kept stretch is the steady rounds': the drifted round's 1.28x (1.6 over 1.25) is left out
    prompt, step = corun_stretches([drifted, steady, drifted, steady, steady])
    assert prompt == pytest.approx(1.02 / 1.005) and step == pytest.approx(0.0205 / 0.0199)
    # no round steady: all of them, rather than nothing
    assert corun_stretches([drifted, drifted])[0] == pytest.approx(1.6 / 1.25)
    assert more_rounds_needed([steady, drifted, steady], wanted=3, most=6)
    assert not more_rounds_needed([steady, drifted, steady, steady], wanted=3, most=6)
    assert not more_rounds_needed([drifted] * 6, wanted=3, most=6)   # the cap holds


def test_a_stretch_outside_what_two_engines_can_do_is_kept_at_the_bound():
    assert chargeable_stretch(1.06234) == 1.0623
    assert chargeable_stretch(0.2) == 0.5 and chargeable_stretch(9.0) == 4.0
    # what is kept is always a stretch the profile accepts
    example = build_example_profile()
    for measured in (0.01, 0.97, 2.49, 50.0):
        replace(example.serving, corun_prefill_stretch=chargeable_stretch(measured))


def test_no_rounds_is_an_error_not_a_ratio_of_one():
    with pytest.raises(ValueError, match="no co-run rounds"):
        corun_stretches([])


def test_the_plan_keeps_within_the_context_the_batch_cap_and_the_kv_cache():
    full = corun_plan(4096, 64, kv_tokens=100_000, quick=False)
    assert (full.prompt_tokens, full.batch, full.rounds, full.repeats, full.max_rounds) == (1024, 16, 3, 3, 6)
    assert (full.hold_context_tokens, full.hold_tokens) == (64, 512)
    assert full.steps == 1 + 6 * 3
    quick = corun_plan(4096, 64, kv_tokens=100_000, quick=True)
    assert (quick.prompt_tokens, quick.rounds, quick.repeats) == (256, 3, 3)
    short = corun_plan(512, 4, kv_tokens=100_000, quick=False)
    assert short.prompt_tokens == 511 and short.batch == 4
    assert short.hold_context_tokens + short.hold_tokens < 512
    # a KV cache of 4,096 tokens holds 16 held requests of 64 + 191 tokens, no more: none is preempted
    small = corun_plan(4096, 64, kv_tokens=4096, quick=False)
    assert small.batch * (small.hold_context_tokens + small.hold_tokens + 1) <= 4096


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
