"""The serving probe's arithmetic and its /proc readings, without a cluster."""

import os
import subprocess
import sys
import time

import pytest

from planner.profiler.serving_probe import CpuRun, cpu_seconds, process_tree, solve_per_request_and_token


def test_per_request_and_per_token_cpu_solve_exactly_through_two_runs():
    # truth: 2 ms per request, 0.1 ms per token
    short = CpuRun(requests=10, tokens=20, cpu_s={"g": 10 * 0.002 + 20 * 0.0001})
    long = CpuRun(requests=10, tokens=320, cpu_s={"g": 10 * 0.002 + 320 * 0.0001})
    per_request, per_token = solve_per_request_and_token(short, long, "g")
    assert per_request == pytest.approx(0.002, abs=1e-12) and per_token == pytest.approx(0.0001, abs=1e-12)


def test_noise_that_would_make_a_cost_negative_is_clamped_to_zero():
    short = CpuRun(10, 20, {"g": 0.05})
    long = CpuRun(10, 320, {"g": 0.04})  # fewer CPU seconds for more tokens: noise
    assert solve_per_request_and_token(short, long, "g") == (0.005, 0.0)


def test_runs_that_stream_the_same_tokens_cannot_separate_the_costs():
    with pytest.raises(ValueError, match="more tokens"):
        solve_per_request_and_token(CpuRun(10, 20, {"g": 1}), CpuRun(10, 20, {"g": 1}), "g")


def test_a_process_tree_and_its_cpu_seconds_come_from_proc():
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {spin!r}]); "
                               "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(tree := process_tree(parent.pid)) < 2 or cpu_seconds(tree) < 0.3:
            assert time.monotonic() < deadline, f"tree {tree} never burned 0.3 CPU seconds"
            time.sleep(0.05)
        assert tree[0] == parent.pid and len(tree) == 2
        assert cpu_seconds(tree) >= 0.3 > cpu_seconds(tree[:1])  # the child did the work
        assert cpu_seconds([2**22 + os.getpid()]) == 0.0  # no such process
    finally:
        for pid in reversed(process_tree(parent.pid)):
            os.kill(pid, 9)
        parent.wait()
