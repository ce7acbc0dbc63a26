"""bench/corun.py explains itself, and its ratio is together over alone, round by round (its runs
start real engines: a benchmark, not a test)."""

import pytest

from bench_scripts import bench_functions, bench_help


def test_the_corun_bench_explains_itself():
    shown = bench_help("corun.py")
    assert "slow each other" in shown and "--prompt-tokens" in shown and "--role" not in shown


def test_a_round_s_ratio_is_its_time_together_over_its_time_alone():
    ratios = bench_functions("corun.py")["ratios"]
    assert ratios([2.0, 4.0], [2.2, 4.0]) == pytest.approx([1.1, 1.0])
    with pytest.raises(ValueError, match="2 rounds alone against 1"):
        ratios([2.0, 4.0], [2.2])
