"""A Ray head of a test's own, started as users start one: `ray start --head` in a subprocess.

Ray runs with its defaults, token authentication included (on, because the test's HOME holds a
token). Everything it could share with another Ray on the machine is the test's: HOME (so
`~/.ray/auth_token`), RAY_TMPDIR (sessions, sockets, logs) and every port it listens on. `ray
stop` would stop every Ray on the machine; `stop_session` stops only the processes of the one
session `ray start` ran in (it starts a new session; Ray's daemons keep it) and their children, in
`ray stop`'s order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdserve.worker.config import free_port

REPO = Path(__file__).resolve().parent.parent
RAY = Path(sys.executable).parent / "ray"
WORKER_PORTS = range(10002, 20000)   # `ray start`'s default --min-worker-port/--max-worker-port


def private_dir(prefix: str) -> Path:
    """A short folder under /tmp: Ray's socket paths inside RAY_TMPDIR must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def ray_env(home: Path, ray_tmpdir: Path) -> dict[str, str]:
    """This process's environment without any Ray setting (an in-process `ray.init()` of an earlier
    test module sets RAY_AUTH_MODE here), with the given HOME and RAY_TMPDIR. Caches stay where
    they are (vLLM's and Hugging Face's live under ~/.cache)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
    env.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    env.update(HOME=str(home), RAY_TMPDIR=str(ray_tmpdir))
    return env


def free_ray_port() -> int:
    """A free port outside the range Ray's workers take theirs from (`ray start` refuses an overlap)."""
    while (port := free_port("127.0.0.1")) in WORKER_PORTS:
        pass
    return port


def isolating_flags() -> list[str]:
    """`ray start` flags for the ports Ray would otherwise take at fixed defaults (client server
    10001, dashboard 8265, dashboard agent 52365); Ray picks the others itself."""
    return ["--ray-client-server-port", str(free_ray_port()), "--dashboard-port", str(free_ray_port()),
            "--dashboard-agent-listen-port", str(free_ray_port())]


def start_head(command: str, env: dict[str, str], log: Path, timeout_s: float = 180.0) -> int:
    """Runs a `ray start --head ...` shell command line; returns the session id of the head's
    processes. Raises RuntimeError with the command's output when it fails."""
    with open(log, "ab") as out:
        process = subprocess.Popen(["bash", "-c", command], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        returncode = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_session(process.pid)
        raise RuntimeError(f"`{command}` did not return within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}") from None
    if returncode != 0:
        stop_session(process.pid)
        raise RuntimeError(f"`{command}` exited with {returncode}:\n{log.read_text()[-3000:]}")
    return process.pid


def session_processes(session: int) -> dict[int, str]:
    """The processes of `session` and all their descendants (pdserve's workers start sessions of
    their own under Ray's actors), by pid: their names (`raylet`, `gcs_server`, ...)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    members: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as stat:
                name, fields = stat.read().split(" (", 1)[1].rsplit(") ", 1)
        except (OSError, ValueError):
            continue
        state, ppid, _, sid = fields.split()[:4]
        if state == "Z":   # a zombie runs no more
            continue
        parents[pid], names[pid] = int(ppid), name
        if int(sid) == session:
            members.add(pid)
    grown = True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in members} - members
        members |= children
        grown = bool(children)
    return {pid: names[pid] for pid in members}


def stop_session(session: int, grace_s: float = 15.0) -> set[int]:
    """Stops the session's processes in `ray stop`'s order: the raylet (its agents and workers go
    with it), then the rest, then the GCS (stopped before the others, it hangs on SIGTERM). Each
    group gets SIGTERM, and SIGKILL after `grace_s`. Returns the processes that had to be killed."""
    groups = (lambda name: name == "raylet", lambda name: name not in ("raylet", "gcs_server"),
              lambda name: name == "gcs_server", lambda name: True)
    killed: set[int] = set()
    for in_group in groups:
        killed |= _terminate({pid for pid, name in session_processes(session).items() if in_group(name)}, grace_s)
    return killed


def _terminate(pids: set[int], grace_s: float) -> set[int]:
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (alive := pids & _running()) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_all(alive, signal.SIGKILL)
    return alive


def _running() -> set[int]:
    running = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
                running.add(int(entry))
        except (OSError, IndexError):
            pass
    return running


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
