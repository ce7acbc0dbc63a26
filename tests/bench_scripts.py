"""The scripts of bench/ as unit tests reach them: what a script's --help shows a newcomer, and its
functions without running it (a benchmark starts real engines; a test checks its pure parts)."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bench_help(script: str) -> str:
    """What `python bench/<script> --help` prints (it must exit 0)."""
    return subprocess.run([sys.executable, str(REPO / "bench" / script), "--help"], capture_output=True,
                          text=True, check=True, timeout=60).stdout


def bench_functions(script: str) -> dict:
    """bench/<script>'s names, the module run as a library (its `__main__` block skipped)."""
    return runpy.run_path(str(REPO / "bench" / script))
