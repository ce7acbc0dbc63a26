"""ChildProcess, the one supervisor of every child pdserve starts: readiness, graceful and forced stop,
crash reporting, signals to the child or its group, and no orphans, with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launch.supervisor import ChildExited, ChildProcess, child_env, pdserve_child, ready_file_probe


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); it is gone for our purpose once it no longer runs
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:  # reaped between the two looks
        return True


SERVE = """
    import sys, time
    time.sleep(0.2)
    open(sys.argv[1], "w").write("10.0.0.1:5000")
    while True:
        time.sleep(1)
"""


def test_ready_returns_the_address_the_child_wrote_and_stop_is_a_sigterm(tmp_path):
    exits = []
    ready = tmp_path / "w.ready"
    child = ChildProcess(python(SERVE) + [str(ready)], tmp_path / "w.log", ready_file_probe(ready),
                         on_exit=lambda code, was_ready: exits.append((code, was_ready))).start()
    assert child.wait_ready(10) == "10.0.0.1:5000"
    assert child.is_ready()
    assert child.stop(timeout_s=5) == -signal.SIGTERM
    assert not child.alive() and exits == []  # a stop asked for is not a crash


def test_a_child_that_exits_before_ready_raises_with_its_log_and_reports_not_ready(tmp_path):
    exits = []
    child = ChildProcess(python("print('model not found: /nope'); raise SystemExit(3)"), tmp_path / "w.log",
                         ready_file_probe(tmp_path / "never"), on_exit=lambda *a: exits.append(a)).start()
    with pytest.raises(ChildExited, match="model not found: /nope"):
        child.wait_ready(10)
    assert child.returncode == 3
    assert wait_for(lambda: exits == [(3, False)])


def test_a_child_that_dies_after_ready_is_reported_as_a_crash(tmp_path):
    exits = []
    ready = tmp_path / "w.ready"
    child = ChildProcess(python(SERVE) + [str(ready)], tmp_path / "w.log", ready_file_probe(ready),
                         on_exit=lambda code, was_ready: exits.append((code, was_ready))).start()
    child.wait_ready(10)
    os.kill(child.pid, signal.SIGKILL)
    assert wait_for(lambda: exits == [(-signal.SIGKILL, True)])
    assert not child.is_ready()


def test_stop_kills_a_child_that_ignores_sigterm_after_the_timeout(tmp_path):
    ready = tmp_path / "w.ready"
    stubborn = """
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(sys.argv[1], "w").write("up")
        time.sleep(60)
    """
    child = ChildProcess(python(stubborn) + [str(ready)], tmp_path / "w.log", ready_file_probe(ready)).start()
    child.wait_ready(10)
    started = time.monotonic()
    assert child.stop(timeout_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_what_the_child_leaves_in_its_process_group_is_killed_when_it_exits(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    leaver = f"""
        import subprocess, time
        p = subprocess.Popen(["sleep", "60"])
        open({str(pid_file)!r}, "w").write(str(p.pid))
        time.sleep(0.3)
    """
    child = ChildProcess(python(leaver), tmp_path / "w.log", ready_file_probe(tmp_path / "never")).start()
    with pytest.raises(ChildExited):
        child.wait_ready(10)
    grandchild = int(pid_file.read_text())
    assert wait_for(lambda: gone(grandchild), 5)


def test_the_child_gets_sigterm_when_its_owner_is_killed(tmp_path):
    """The owner (a Ray actor in production) dies by SIGKILL: the child must not outlive it."""
    marker, ready = tmp_path / "got-sigterm", tmp_path / "w.ready"
    grandchild = _records_sigterm(marker, ready)
    owner = f"""
        import sys, time
        from pathlib import Path
        from launch.supervisor import ChildProcess, ready_file_probe
        child = ChildProcess({python(grandchild)!r}, Path({str(tmp_path / 'w.log')!r}),
                             ready_file_probe(Path({str(ready)!r}))).start()
        child.wait_ready(20)
        print(child.pid, flush=True)
        time.sleep(60)
    """
    process = subprocess.Popen(python(owner), stdout=subprocess.PIPE, text=True)
    child_pid = -1
    try:
        child_pid = int(process.stdout.readline())
        process.kill()
        process.wait()
        assert wait_for(lambda: marker.exists(), 10), "the child did not get SIGTERM when its owner died"
        assert marker.read_text() == "SIGTERM"
        assert wait_for(lambda: gone(child_pid), 5)
    finally:
        process.kill()
        process.wait()
        if child_pid > 0 and not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def test_a_child_started_from_a_thread_that_ends_outlives_the_thread_but_not_its_owner(tmp_path):
    """The planner starts workers from a pool thread: the death signal must follow the process, not
    the thread that called `start()` (a `preexec_fn` PR_SET_PDEATHSIG would kill it with the thread)."""
    marker, ready = tmp_path / "got-sigterm", tmp_path / "w.ready"
    grandchild = _records_sigterm(marker, ready)
    owner = f"""
        import threading, time
        from pathlib import Path
        from launch.supervisor import ChildProcess, ready_file_probe
        children = []
        starter = threading.Thread(target=lambda: children.append(ChildProcess(
            {python(grandchild)!r}, Path({str(tmp_path / 'w.log')!r}), ready_file_probe(Path({str(ready)!r}))).start()))
        starter.start()
        starter.join()
        children[0].wait_ready(20)
        print(children[0].pid, flush=True)
        time.sleep(60)
    """
    process = subprocess.Popen(python(owner), stdout=subprocess.PIPE, text=True)
    child_pid = -1
    try:
        child_pid = int(process.stdout.readline())
        assert not gone(child_pid) and not marker.exists(), "the child died with the thread that started it"
        process.kill()
        process.wait()
        assert wait_for(lambda: marker.exists(), 10), "the child did not get SIGTERM when its owner died"
        assert wait_for(lambda: gone(child_pid), 5)
    finally:
        process.kill()
        process.wait()
        if child_pid > 0 and not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def test_terminate_reaches_the_child_alone_and_signal_group_reaches_its_whole_group(tmp_path):
    ready, pid_file = tmp_path / "w.ready", tmp_path / "grandchild.pid"
    parent = f"""
        import signal, subprocess, sys, time
        p = subprocess.Popen(["sleep", "60"])
        open({str(pid_file)!r}, "w").write(str(p.pid))
        signal.signal(signal.SIGTERM, lambda *_: open({str(ready)!r} + ".term", "w").write("x"))
        open({str(ready)!r}, "w").write("up")
        while True:
            time.sleep(0.05)
    """
    child = ChildProcess(python(parent), tmp_path / "w.log", ready_file_probe(ready)).start()
    try:
        child.wait_ready(10)
        grandchild = int(pid_file.read_text())
        child.terminate()
        assert wait_for(lambda: Path(f"{ready}.term").exists())
        assert child.alive() and not gone(grandchild)  # SIGTERM went to the child alone, which ignored it
        with pytest.raises(TimeoutError):
            child.wait(timeout_s=0.1)
        child.signal_group(signal.SIGKILL)
        assert child.wait(timeout_s=10) == -signal.SIGKILL
        assert wait_for(lambda: gone(grandchild), 5)
    finally:
        child.stop(timeout_s=0)


def test_kill_is_a_crash_reported_to_on_exit_with_its_exit_code(tmp_path):
    exits = []
    ready = tmp_path / "w.ready"
    child = ChildProcess(python(SERVE) + [str(ready)], tmp_path / "w.log", ready_file_probe(ready),
                         on_exit=lambda code, was_ready: exits.append((code, was_ready))).start()
    child.wait_ready(10)
    assert child.kill() == -signal.SIGKILL
    assert wait_for(lambda: exits == [(-signal.SIGKILL, True)])


def test_pdserve_child_removes_a_stale_ready_file_and_logs_in_its_folder(tmp_path):
    (tmp_path / "w0.ready").write_text("old:1")
    child = pdserve_child(["worker", "--role", "decode"], tmp_path, "w0")
    assert not (tmp_path / "w0.ready").exists()
    assert child.log_path == tmp_path / "w0.log" and child.name == "w0"
    assert child.argv[-2:] == ["--ready-file", str(tmp_path / "w0.ready")]
    assert child.argv[1:3] == ["-m", "cli.main"] and not child.alive()


def test_child_env_keeps_a_set_vllm_log_level_and_defaults_it_to_warning():
    assert child_env({"PATH": "/bin"}) == {"PATH": "/bin", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    assert child_env({"VLLM_LOGGING_LEVEL": "DEBUG"})["VLLM_LOGGING_LEVEL"] == "DEBUG"


def _records_sigterm(marker, ready) -> str:
    """A child's script: writes `ready`, then waits; on SIGTERM it writes "SIGTERM" to `marker`."""
    return f"""
        import os, signal, sys, time
        def on_term(*_):
            open({str(marker)!r} + ".tmp", "w").write("SIGTERM")
            os.replace({str(marker)!r} + ".tmp", {str(marker)!r})  # whole or absent: the test reads it
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        open({str(ready)!r}, "w").write("up")
        time.sleep(60)
    """
