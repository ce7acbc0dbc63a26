"""One child process owned by one parent, tied to the parent's life: the only way pdserve starts a
process (LocalCluster's router and workers, the planner's workers, a Ray member, the private
redis-server). No Ray in here.

Contract of `ChildProcess`:

- the child never outlives the parent *process*, whichever thread started it and however the
  parent dies (even SIGKILL): the child is forked by a *babysitter* thread that lives exactly as
  long as the child, through a tiny exec helper that asks Linux for `PR_SET_PDEATHSIG`. The kernel
  ties that signal to the thread that forked, so the babysitter (never the caller, which may be a
  short-lived thread of a pool) forks, and the child receives `death_signal` (SIGTERM by default:
  a pdserve worker deregisters and drains) only when the babysitter ends, that is when the child
  has exited or when the whole parent process dies. No `preexec_fn` runs, which could deadlock in
  a process with threads (a Ray actor, the planner's asyncio executor);
- the child runs in its own session and process group (a Ctrl-C meant for the parent does not
  skip the drain) with stdout and stderr in `log_path`;
- the babysitter polls `probe()` until it returns the child's address (ready), then waits for the
  child to exit; an exit that `stop()` did not ask for calls `on_exit(returncode, was_ready)`;
- after the child exits, whatever is left of its process group (vLLM's engine core) is killed:
  a child never leaves orphans behind while the parent lives;
- `terminate()` is SIGTERM to the child alone (a worker drains with its engine intact),
  `signal_group(sig)` reaches the whole group, `stop(timeout_s)` is terminate, then SIGKILL to the
  group after `timeout_s`. Exit codes are Popen's: negative for a signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kv_transfer.shm_segment import sweep_stale
from launch.commands import pdserve_argv
from pdserve.engine_process import REEXEC_MARK, THREAD_KEYS

Probe = Callable[[], "str | None"]
OnExit = Callable[[int, bool], None]


class ChildExited(RuntimeError):
    """The child exited before it was ready; the message carries the end of its log."""


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every child gets: `base` (default: this process's), vLLM logging at WARNING
    unless `VLLM_LOGGING_LEVEL` says otherwise, and unbuffered Python output (logs stay current)."""
    env = dict(os.environ if base is None else base)
    for key in (*THREAD_KEYS, REEXEC_MARK):  # an engine this process ran bound its own threads; children bind theirs
        env.pop(key, None)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ready_file_probe(path: Path) -> Probe:
    """Ready once `path` holds a non-empty line (what `pdserve worker|router --ready-file` writes)."""

    def probe() -> str | None:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        return text or None

    return probe


def tcp_probe(host: str, port: int, address: str) -> Probe:
    """Ready (as `address`) once `host:port` accepts a TCP connection, e.g. a redis-server."""

    def probe() -> str | None:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return address
        except OSError:
            return None

    return probe


class ChildProcess:
    def __init__(self, argv: Sequence[str], log_path: Path, probe: Probe, env: Mapping[str, str] | None = None,
                 on_exit: OnExit | None = None, death_signal: int = signal.SIGTERM, poll_s: float = 0.1):
        """Nothing runs until `start()`. `env` defaults to `child_env()`."""
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.name = self.log_path.stem
        self.probe = probe
        self.env = child_env() if env is None else dict(env)
        self.on_exit = on_exit
        self.death_signal = death_signal
        self.poll_s = poll_s
        self.address: str | None = None
        self.returncode: int | None = None
        self._popen: subprocess.Popen | None = None
        self._started = threading.Event()
        self._ready = threading.Event()
        self._exited = threading.Event()
        self._stopping = False
        self._spawn_error: BaseException | None = None
        self._thread = threading.Thread(target=self._babysit, name=f"babysit-{self.name}", daemon=True)

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "ChildProcess":
        """Starts the child (not waiting for ready); raises OSError if it could not be started."""
        self._thread.start()
        self._started.wait()
        if self._spawn_error is not None:
            raise self._spawn_error
        return self

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id); -1 before `start()`."""
        return self._popen.pid if self._popen else -1

    def alive(self) -> bool:
        return self._popen is not None and not self._exited.is_set()

    def is_ready(self) -> bool:
        return self._ready.is_set() and self.alive()

    def wait_ready(self, timeout_s: float) -> str:
        """The child's address once ready; ChildExited if it died first, TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self._ready.is_set():
            if self._exited.is_set():
                raise ChildExited(f"{self.name} exited with code {self.returncode} before it was ready; "
                                  f"end of {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready within {timeout_s:.0f} s; "
                                   f"end of {self.log_path}:\n{self.log_tail()}")
            self._exited.wait(self.poll_s)
        return self.address or ""

    def wait(self, timeout_s: float | None = None) -> int:
        """The exit code once the child exited (and its group was killed); TimeoutError after `timeout_s`."""
        if not self._exited.wait(timeout_s):
            raise TimeoutError(f"{self.name} (pid {self.pid}) still runs after {timeout_s:g} s")
        return self.returncode if self.returncode is not None else -1

    def terminate(self) -> None:
        """SIGTERM to the child alone, as a container runtime's init sends it: a worker drains with
        its engine processes intact, then stops them itself. Does not wait."""
        if self.alive():
            _signal_pid(self.pid, signal.SIGTERM)

    def signal_group(self, sig: int) -> None:
        """`sig` to the child's whole process group (the pdserve process and vLLM's engine processes)."""
        if self.alive():
            _signal_group(self.pid, sig)

    def kill(self) -> int:
        """SIGKILL to the whole group, as a crash (no drain); its exit code. Reported to `on_exit`."""
        self.signal_group(signal.SIGKILL)
        return self.wait()

    def stop(self, timeout_s: float = 60.0) -> int:
        """`terminate()`, SIGKILL to the group after `timeout_s`; its exit code (-1 if never started)."""
        self._stopping = True
        if self._popen is None:
            return -1
        self.terminate()
        if not self._exited.wait(timeout_s):
            self.signal_group(signal.SIGKILL)
        return self.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log yet)"

    # ---- the babysitter thread -------------------------------------------------------------------
    def _babysit(self) -> None:
        try:
            self._popen = self._spawn()
        except OSError as error:
            self._spawn_error = error
            self._exited.set()
            return
        finally:
            self._started.set()
        try:
            self._watch_readiness()
        finally:  # even if the probe raised: this thread must live as long as the child (death signal)
            self.returncode = self._popen.wait()
            _signal_group(self._popen.pid, signal.SIGKILL)  # engine processes the child left behind
            if self.returncode != 0:  # a killed engine cannot unlink its shared KV cache: free it now if its
                # processes are gone already (killpg is asynchronous); the next producer's start sweeps otherwise
                with contextlib.suppress(OSError):
                    sweep_stale()
            self._exited.set()
        if not self._stopping and self.on_exit is not None:
            self.on_exit(self.returncode, self._ready.is_set())

    def _watch_readiness(self) -> None:
        while self._popen.poll() is None:
            address = self.probe()
            if address:
                self.address = address
                self._ready.set()
                return
            time.sleep(self.poll_s)

    def _spawn(self) -> subprocess.Popen:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = death_signal_argv(self.argv, self.death_signal, os.getpid())
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, start_new_session=True)


def pdserve_child(args: Sequence[str], folder: Path, name: str, on_exit: OnExit | None = None,
                  command_prefix: Sequence[str] = ()) -> ChildProcess:
    """`pdserve ARGS --ready-file FOLDER/NAME.ready`, logging to `FOLDER/NAME.log`, ready (with the
    line the command writes, e.g. its address) once the ready file is written. Not started yet; a
    stale ready file of an earlier run is removed first. `command_prefix` runs it elsewhere (e.g.
    `ip netns exec NS`: it must exec the command, so the death signal and the group still hold,
    and see FOLDER)."""
    ready = Path(folder) / f"{name}.ready"
    ready.unlink(missing_ok=True)
    return ChildProcess([*command_prefix, *pdserve_argv([*args, "--ready-file", str(ready)])],
                        Path(folder) / f"{name}.log", ready_file_probe(ready), on_exit=on_exit)


# Runs first in the child: asks for the death signal, checks the parent did not die before that
# took effect, then becomes the real command (the death signal survives exec). A helper process
# instead of `preexec_fn`, which may deadlock in a process with threads (a Ray actor has many).
_DEATH_SIGNAL_EXEC = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[1]), 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[2]): sys.exit(1)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def death_signal_argv(argv: Sequence[str], sig: int, parent_pid: int) -> list[str]:
    """`argv`, run so that it receives `sig` when the thread that started it exits (Linux)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _DEATH_SIGNAL_EXEC, str(int(sig)), str(parent_pid), *argv]


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # already gone: what we wanted


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty (PermissionError: a reused id now owned by someone else)
