"""bench/decode_steps_beside.py explains itself and sorts a decode worker's steps by what ran beside
them (hand-made steps and joins: calls accepted, pulls in flight, the prefill engine stepping)."""

import math

import pytest

from bench_scripts import bench_functions, bench_help
from pdserve.engine_step_trace import TracedJoin, TracedStep

BENCH = bench_functions("decode_steps_beside.py")


def step(start_s: float, end_s: float, batch: int, joined: int = 0) -> TracedStep:
    return TracedStep(start_s, end_s, joined, batch - joined, batch, batch - joined, 100 * batch)


def pulled(accepted_s: float, arrived_s: float, pulled_s: float) -> TracedJoin:
    return TracedJoin("r", 64, accepted_s, arrived_s, pulled_s, pulled_s + 0.01, pulled_s + 0.02)


def test_the_script_explains_itself():
    shown = bench_help("decode_steps_beside.py")
    assert "--run" in shown and "--profile" in shown and "--step-trace" in shown


def test_what_ran_beside_a_step_calls_accepted_pulls_in_flight_and_the_prefill_engines_share():
    s = step(1.0, 1.010, 4)
    joins = [pulled(1.002, 1.004, 1.030),    # accepted within, its pull spans the step's end
             pulled(0.990, 0.995, 1.001),    # accepted before; its pull ends 1 ms into the step
             pulled(1.010, 1.020, 1.040),    # accepted at the end (counted: (start, end]); pull after
             TracedJoin("p", 64, 1.003, 1.004, math.nan, 1.0, 1.1)]   # a prompt computed here: no pull
    prefill = [step(0.995, 1.004, 1), step(1.0095, 1.050, 1)]   # 4 ms + 0.5 ms of the 10 ms step
    got = BENCH["beside"](s, [j for j in joins if j.pulled], prefill)
    assert (got.calls, got.pulls) == (2, 2) and got.prefill_share == pytest.approx(0.45)
    assert got.label == "call+pull"                  # under half of it: not beside a prompt
    assert BENCH["Beside"](0, 0, 0.6).label == "prompt" and BENCH["Beside"](0, 0, 0.0).label == "-"
    assert [BENCH["batch_label"](b) for b in (1, 2, 7, 8, 31, 32, 500)] == ["1", "2-7", "2-7", "8-31", "8-31",
                                                                             "32+", "32+"]


def test_steady_steps_are_set_against_the_yardstick_by_batch_and_what_ran_beside():
    steps = [step(0.0, 0.010, 2), step(0.010, 0.030, 2), step(0.030, 0.045, 2, joined=1), step(0.045, 0.055, 9)]
    joins = [pulled(0.012, 0.013, 0.028)]            # accepted during the second step, pulled beside it
    cells = BENCH["steady_table"](BENCH["steady_beside"](steps, joins, [step(0.046, 0.054, 1)]), lambda s: 0.010)
    assert cells[("2-7", "-")] == pytest.approx([1.0])
    assert cells[("2-7", "call+pull")] == pytest.approx([2.0])
    assert cells[("8-31", "prompt")] == pytest.approx([1.0])   # 8 of its 10 ms beside a prompt
    assert sum(len(v) for k, v in cells.items() if k[0] == "all") == 3   # the join step is not steady
    over = BENCH["time_over"](steps, lambda s: 0.010)
    assert over == pytest.approx({"steady_over_s": 0.010, "join_over_s": 0.005, "steady_yardstick_s": 0.030})


def test_the_handoffs_excess_is_over_the_quiet_steps_of_the_same_batch():
    steps = [step(0.000, 0.010, 2), step(0.010, 0.020, 2), step(0.020, 0.045, 2),   # quiet, quiet, a call in
             step(0.045, 0.065, 9), step(0.065, 0.080, 9)]                          # a pull beside, quiet
    joins = [pulled(0.030, 0.031, 0.033), pulled(0.040, 0.050, 0.060)]
    # the calls' step: 2.5 against its batch's quiet 1.0 at 10 ms -> 15 ms; the pull's step 2.0 against 1.5 -> 5 ms
    excess = lambda steps: BENCH["handoff_excess_s"](BENCH["steady_beside"](steps, joins, []), lambda s: 0.010)  # noqa: E731
    assert excess(steps) == pytest.approx(0.020)
    # with no quiet step at a batch, that batch's handoff steps are not counted
    assert excess(steps[:4]) == pytest.approx(0.015)
