"""bench/corun.py explains itself, and its ratio is together over alone, round by round (its runs
start real engines: a benchmark, not a test)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location("corun_bench", REPO / "bench" / "corun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_corun_bench_explains_itself():
    shown = subprocess.run([sys.executable, str(REPO / "bench" / "corun.py"), "--help"],
                           capture_output=True, text=True, check=True, timeout=60)
    assert "slow each other" in shown.stdout and "--prompt-tokens" in shown.stdout and "--role" not in shown.stdout


def test_a_round_s_ratio_is_its_time_together_over_its_time_alone():
    assert _bench().ratios([2.0, 4.0], [2.2, 4.0]) == pytest.approx([1.1, 1.0])
    with pytest.raises(ValueError, match="2 rounds alone against 1"):
        _bench().ratios([2.0, 4.0], [2.2])
