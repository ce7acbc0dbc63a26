"""Native thread names, so that a KV server's threads can be told apart in /proc, `top -H` and
`py-spy` (Python 3.11 names only its own `threading.Thread` objects; the kernel sees the
process's name on every thread). `loadgen.proc_cpu.named_threads_cpu_s` measures the CPU a
producer spends serving transfers, and a consumer pulling, by these names."""

from __future__ import annotations

import ctypes
import ctypes.util

PR_SET_NAME = 15
# the consumer's threads in the decode engine's process: its pulls (copy, checksums, the exchange
# with the producer) and the notices it sends after them
PULL_THREAD_NAME, NOTICE_THREAD_NAME = "pdserve-kv-pull", "pdserve-kv-note"
# what every KV connector thread's name starts with, the producer's ("pdserve-kv-srv", "pdserve-kv-conn") too
KV_THREAD_PREFIX = "pdserve-kv"
MAX_NAME_BYTES = 15  # the kernel keeps 16 bytes, the terminating NUL included

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def name_this_thread(name: str) -> None:
    """Sets the calling thread's kernel name (`/proc/<pid>/task/<tid>/comm`), cut to 15 bytes.
    Best effort: a platform without prctl keeps the old name."""
    try:
        _libc.prctl(PR_SET_NAME, name.encode()[:MAX_NAME_BYTES], 0, 0, 0)
    except AttributeError:  # no prctl (not Linux)
        pass
