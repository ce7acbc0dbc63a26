"""bench/executor_ab.py explains itself (its runs start real engines: a benchmark, not a test)."""

from bench_scripts import bench_help


def test_the_executor_comparison_explains_itself():
    shown = bench_help("executor_ab.py")
    assert "engine-core process" in shown and "--rounds" in shown and "--one" not in shown
