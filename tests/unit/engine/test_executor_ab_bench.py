"""bench/executor_ab.py explains itself (its runs start real engines: a benchmark, not a test)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_executor_comparison_explains_itself():
    shown = subprocess.run([sys.executable, str(REPO / "bench" / "executor_ab.py"), "--help"],
                           capture_output=True, text=True, check=True, timeout=60)
    assert "engine-core process" in shown.stdout and "--rounds" in shown.stdout and "--one" not in shown.stdout
