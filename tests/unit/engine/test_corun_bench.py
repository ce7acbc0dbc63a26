"""bench/corun.py explains itself, and its ratio is together over alone, round by round (its runs
start real engines: a benchmark, not a test)."""

from bench_scripts import bench_functions, bench_help


def test_the_corun_bench_explains_itself():
    shown = bench_help("corun.py")
    assert "slow each other" in shown and "--prompt-tokens" in shown and "--role" not in shown


def test_each_round_shows_its_alones_its_together_and_its_ratio_and_a_drifted_round_is_marked():
    from planner.profiler.corun_fit import CorunRound

    table = bench_functions("corun.py")["summary_table"]
    rounds = [CorunRound(2.0, 2.2, 0.010, 0.010, prompt_alone_after_s=2.0, step_alone_after_s=0.010),
              CorunRound(2.0, 3.0, 0.010, 0.010, prompt_alone_after_s=3.0, step_alone_after_s=0.010)]
    text = table(rounds, 1024, 16, "0", "1")
    prompt_row = next(line for line in text.splitlines() if line.startswith("| prompt |"))
    assert "2.0000 / 2.0000 ; 2.0000 / 3.0000" in prompt_row
    assert prompt_row.endswith("| 1.100 / 1.200* |")   # 3.0 over the alones' mean 2.5; 50% apart: not counted
