"""Leaving a server process that imported vLLM, once it has stopped in order, without the
interpreter's teardown.

After a worker has drained and stopped its engine (or a router its servers), what is left to do
is Python's finalization: atexit handlers, then freeing every module and object of vLLM, torch and
transformers (~5,000 modules). That took 2.1 s of CPU on an AVX2-only EPYC for a process that only
imported vLLM, and ~4.8 s from a drained worker's "drained in 0.0 s" to its exit: each `pdserve up`
stop, planner scale-down, rolling restart and pod termination waited for it. Nothing pdserve holds
needs it: the engine's processes are stopped by `engine.shutdown()`, the KV segments by the engine
core's connector, the registry by its explicit close. What the process still owes (buffered trace
spans, log handlers, stdio) is flushed here first, then the process ends with its exit code.

Only for a process that is the command itself: `cli.main.main` ends it here after a command that
asks for it (`skips_teardown` in its parser's defaults: worker, router, profile) returned; a
program that calls `cli.main.main(argv)` keeps its interpreter and gets the code.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Flushes trace spans (`pdserve.tracing.stop`), every logging handler and stdio, then ends the
    process with `code` at once: no atexit handler and no finalizer runs after this."""
    from pdserve import tracing

    try:
        tracing.stop()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):   # a closed or broken pipe: nothing more can be said there
                pass
        os._exit(code)
