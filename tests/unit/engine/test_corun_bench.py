"""bench/corun.py explains itself, and shows every phase's cycles and the figures a profile would keep
(its runs start real engines: a benchmark, not a test)."""

from bench_scripts import bench_functions, bench_help


def test_the_corun_bench_explains_itself():
    shown = bench_help("corun.py")
    assert "slow each other" in shown and "--prompt-tokens" in shown and "--repeat" in shown and "--role" not in shown


def test_each_phase_shows_its_cycles_its_median_and_spread_and_each_repeat_what_a_profile_keeps(tmp_path):
    from planner.profiler.corun_fit import CorunMeasure

    functions = bench_functions("corun.py")
    repeats = [[CorunMeasure("decode", 1, (1.1, 1.3, 1.2), 90, 95), CorunMeasure("decode", 16, (1.0,), 30, 31),
                CorunMeasure("prompt", 16, (1.05, 1.01), 6, 7)],
               [CorunMeasure("decode", 1, (1.0,), 90, 95)]]   # a repeat whose other phases measured nothing
    text = functions["summary_table"](repeats)
    row = next(line for line in text.splitlines() if line.startswith("| 1 | decode step, batch 1 |"))
    assert row == "| 1 | decode step, batch 1 | 1.100 1.300 1.200 | 1.200 | 1.120-1.280 | 90 / 95 |"
    assert "| 1 | prompt, beside a batch of 16 | 1.050 1.010 | 1.030 |" in text
    # the profile's decode figure is the median over batches (1.2 and 1.0)
    assert "repeat 1: the profile would keep a prompt 1.030x, a decode step 1.100x" in text
    assert "repeat 2: the profile would keep a prompt not measured, a decode step 1.000x" in text
    functions["plot"](repeats, tmp_path / "corun.png")
    assert (tmp_path / "corun.png").stat().st_size > 5_000
