"""Children that do not outlive their parent.

A cluster's processes run in their own process groups (so a Ctrl-C meant for the parent does not
skip the drain), which also means nothing stops them when the parent is killed outright (a CI
timeout, `kill -9`). On Linux the kernel can send a signal to a child when its parent dies
(`PR_SET_PDEATHSIG`); `die_with_parent()` is the `preexec_fn` that asks for it.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
from typing import Callable

_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that delivers SIGTERM to the child when the parent dies, or None.

    None off Linux, and off the main thread: the kernel ties the signal to the *thread* that forked,
    so a child spawned from a worker thread would be killed when that thread ends."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    return _set_parent_death_signal
