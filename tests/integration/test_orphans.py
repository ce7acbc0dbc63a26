"""No process pdserve starts outlives its parent, even when the parent is SIGKILLed.

Both parents are the real commands, run as subprocesses, and killed once everything they started
serves; every descendant (found through /proc, recursively) must then be gone within 30 s:

- `pdserve up`: it starts its redis-server, router and workers from its main thread;
- `pdserve planner --actuator local`: it starts a decode worker from a worker thread of its event
  loop (`asyncio.to_thread(actuator.scale, ...)` -> `WorkerProcesses.add_worker`). A death signal
  asked for by a `preexec_fn` in that thread (the old `launch.orphans.die_with_parent`, which gave
  up off the main thread) left such a worker and its vLLM engine running after the planner died.

Start-up (~15-30 s per engine on 2 cores) is waited for with a generous deadline; the death is
held to 30 s: a worker's death signal is SIGTERM, so it drains and gives vLLM its 5 s shutdown
grace, which a loaded 2-core host stretched past 10 s in a clean-clone run (the processes did go).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from cluster_helpers import engine_settings
from launch.commands import engine_option_argv, pdserve_argv
from launch.redis_server import start_redis
from pdserve.keys import router_load_key, worker_key
from pdserve.registry import WorkerRecord
from router.live_stats import LoadSummary

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 300.0
DEATH_TIMEOUT_S = 30.0


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children of any of its threads, recursively)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except FileNotFoundError:
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (its parent died; it runs no code)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log and log.exists() else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{tail}")
        time.sleep(0.2)


def start_parent(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})


def kill_and_assert_descendants_die(parent: subprocess.Popen, started: list[int]) -> None:
    """SIGKILL `parent` (no cleanup runs in it); every pid of `started` must stop within DEATH_TIMEOUT_S."""
    parent.kill()
    parent.wait()
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < DEATH_TIMEOUT_S and not all(gone(pid) for pid in started):
        time.sleep(0.1)
    alive = {pid: cmdline(pid) for pid in started if not gone(pid)}
    assert alive == {}, f"still running {DEATH_TIMEOUT_S:g} s after their parent was SIGKILLed: {alive}"


def kill_leftovers(pids: list[int]) -> None:
    """Cleanup after a failed assertion, so a survivor does not load the host for later tests."""
    for pid in pids:
        if not gone(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # died meanwhile: nothing to clean


def test_pdserve_up_killed_leaves_no_redis_router_worker_or_engine_running(tiny_model, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "up.out"
    argv = pdserve_argv(["up", "--grpc-port", "0", "--http-port", "0", "--prefill-cores", "0", "--decode-cores", "1",
                         "--log-dir", str(logs), *engine_option_argv(engine_settings(tiny_model))])
    parent = start_parent(argv, out)
    started: list[int] = []
    try:
        wait_until(lambda: "pdserve is up" in out.read_text(errors="replace") or parent.poll() is not None,
                   START_TIMEOUT_S, "pdserve up to serve", out)
        assert parent.poll() is None, f"pdserve up exited with {parent.returncode}:\n{out.read_text()}"
        started = descendants(parent.pid)
        commands = [cmdline(pid) for pid in started]
        for expected in ("redis-server", " router ", "--role prefill", "--role decode"):
            assert any(expected in c for c in commands), f"no {expected!r} among pdserve up's processes: {commands}"
        assert len(started) >= 6, f"expected redis, router and two workers with engines, got {commands}"
        kill_and_assert_descendants_die(parent, started)
    finally:
        parent.kill()
        parent.wait()
        kill_leftovers(started)


def test_pdserve_planner_killed_leaves_no_worker_it_started_from_its_actuator_thread(tiny_model, tmp_path):
    """The real `pdserve planner --actuator local`, over a private Redis holding one router's load
    summary (5 req/s) and the records of a 1P+1D cluster, so its first decision adds a decode worker."""
    server = start_redis()
    cluster, logs, out = f"orphans{uuid.uuid4().hex[:6]}", tmp_path / "workers", tmp_path / "planner.out"
    client = redis.Redis.from_url(server.url)
    summary = LoadSummary("r1", 0.0, 10.0, 50, 3, 5.0, 512.0, 128.0, 0.3, 0.6, 0.04, 0.06)
    client.set(router_load_key(cluster, "r1"), summary.to_json(), px=600_000)
    for worker_id, role in (("p0", "prefill"), ("d0", "decode")):
        client.hset(worker_key(cluster, worker_id), mapping=WorkerRecord(worker_id, role, "m", "x:1").to_hash())
    argv = pdserve_argv(["planner", "--redis-url", server.url, "--cluster", cluster, "--actuator", "local",
                         "--max-prefill", "1", "--max-decode", "2", "--interval-s", "600", "--sim-requests", "100",
                         "--tpot-slo-s", "0.05", "--ttft-slo-s", "1", "--decode-cores", "1",
                         "--worker-log-dir", str(logs), *engine_option_argv(engine_settings(tiny_model))])
    parent = start_parent(argv, out)
    started: list[int] = []
    try:
        def worker_ready() -> bool:
            return parent.poll() is not None or any(f.read_text().strip() for f in logs.glob("decode-*.ready"))

        wait_until(worker_ready, START_TIMEOUT_S, "the planner's decode worker to serve", out)
        assert parent.poll() is None, f"pdserve planner exited with {parent.returncode}:\n{out.read_text()}"
        started = descendants(parent.pid)
        workers = [pid for pid in started if "--role decode" in cmdline(pid)]
        assert len(workers) == 1, f"expected one decode worker below the planner: {[cmdline(p) for p in started]}"
        assert len(started) >= 2, f"expected the worker and its vLLM engine: {[cmdline(p) for p in started]}"
        kill_and_assert_descendants_die(parent, started)
    finally:
        parent.kill()
        parent.wait()
        kill_leftovers(started)
        client.close()
        server.stop()
