"""One child process owned by one parent, tied to the parent's life. No Ray in here.

A Ray actor of pdserve does not run vLLM itself: vLLM spawns its own processes and wants a
`__main__`-guarded entry point, so the actor owns a `pdserve worker|router` (or `redis-server`)
subprocess, exactly the process the local launcher starts. `ChildProcess` is that ownership:

- the child is started from a *babysitter* thread that lives exactly as long as the child and
  asks Linux for `PR_SET_PDEATHSIG`: if the parent dies (even by SIGKILL), the child receives
  `death_signal` (SIGTERM by default: a pdserve worker deregisters and drains). The signal is
  tied to the thread that forked, which is why the babysitter, not the caller, forks;
- the babysitter polls `probe()` until it returns the child's address (ready), then waits for
  the child to exit; an exit that `stop()` did not ask for calls `on_exit(returncode, was_ready)`;
- after the child exits, whatever is left of its process group (vLLM's engine core) is killed:
  a child never leaves orphans behind;
- `stop()` sends SIGTERM to the child alone (so a worker drains with its engine intact), and
  SIGKILL to its whole group after `timeout_s`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

Probe = Callable[[], "str | None"]
OnExit = Callable[[int, bool], None]


class ChildExited(RuntimeError):
    """The child exited before it was ready; the message carries the end of its log."""


def ready_file_probe(path: Path) -> Probe:
    """Ready once `path` holds a non-empty line (what `pdserve worker|router --ready-file` writes)."""

    def probe() -> str | None:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        return text or None

    return probe


class ChildProcess:
    def __init__(self, argv: Sequence[str], log_path: Path, probe: Probe, env: dict[str, str] | None = None,
                 on_exit: OnExit | None = None, death_signal: int = signal.SIGTERM, poll_s: float = 0.1):
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.probe = probe
        self.env = env
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
        self._thread = threading.Thread(target=self._babysit, name=f"babysit-{self.log_path.stem}", daemon=True)

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "ChildProcess":
        self._thread.start()
        self._started.wait()
        if self._spawn_error is not None:
            raise self._spawn_error
        return self

    @property
    def pid(self) -> int:
        return self._popen.pid if self._popen else -1

    def alive(self) -> bool:
        return not self._exited.is_set()

    def is_ready(self) -> bool:
        return self._ready.is_set() and self.alive()

    def wait_ready(self, timeout_s: float) -> str:
        """The child's address once ready; ChildExited if it died first, TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self._ready.is_set():
            if self._exited.is_set():
                raise ChildExited(f"{self.log_path.stem} exited with code {self.returncode} before it was ready; "
                                  f"end of {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready within {timeout_s:.0f} s; end of {self.log_path}:\n{self.log_tail()}")
            self._exited.wait(self.poll_s)
        return self.address or ""

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM to the child (it drains), SIGKILL to its group after `timeout_s`; its exit code."""
        self._stopping = True
        if self._popen is None:
            return -1
        _signal_pid(self._popen.pid, signal.SIGTERM)
        if not self._exited.wait(timeout_s):
            _signal_group(self._popen.pid, signal.SIGKILL)
            self._exited.wait()
        return self.returncode if self.returncode is not None else -1

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
        while self._popen.poll() is None and not self._ready.is_set():
            address = self.probe()
            if address:
                self.address = address
                self._ready.set()
                break
            time.sleep(self.poll_s)
        self.returncode = self._popen.wait()
        _signal_group(self._popen.pid, signal.SIGKILL)  # engine processes the child left behind
        self._exited.set()
        if not self._stopping and self.on_exit is not None:
            self.on_exit(self.returncode, self._ready.is_set())

    def _spawn(self) -> subprocess.Popen:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = death_signal_argv(self.argv, self.death_signal, os.getpid())
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, start_new_session=True)


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
