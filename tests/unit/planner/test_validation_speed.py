"""A decode worker's steps against its core's interpreter, window by window (`planner.validation_speed`),
on synthetic traces whose elasticity is known."""

from __future__ import annotations

import pytest

from pdserve.engine_step_trace import TracedStep
from planner.validation_speed import (InterpreterSeries, decode_core_series, elasticity, step_ratio_by_window,
                                      worker_elasticity)


def steps_at(speeds: list[float], elasticity_: float, model_s: float = 0.004, per_window: int = 20,
             start_s: float = 100.0) -> list[TracedStep]:
    """`per_window` steady one-sequence decode steps in each 1 s window from `start_s`, each
    `model_s` x speed ** `elasticity_` long."""
    steps = []
    for window, speed in enumerate(speeds):
        for k in range(per_window):
            at = start_s + window + k * 0.04
            steps.append(TracedStep(at, at + model_s * speed ** elasticity_, 0, 1, 1, 1, 100))
    return steps


SPEEDS = [1.0, 1.5, 1.0, 1.2, 1.6, 1.0, 1.4, 1.1, 1.0, 1.5]


def test_the_steps_median_over_the_model_is_read_window_by_window():
    steps = steps_at([1.0, 2.0], 1.0) + [TracedStep(100.5, 100.9, 1, 0, 1, 1, 100),   # a join: not steady
                                         TracedStep(101.5, 101.9, 0, 1, 64, 1, 100)]  # a prompt chunk: not a decode
    model = lambda batch, context: 0.004   # noqa: E731
    assert step_ratio_by_window(steps, model, 100.0, 1.0, 3) == pytest.approx([1.0, 2.0, None])   # window 2: none
    assert step_ratio_by_window(steps[:4], model, 100.0, 1.0, 1) == [None]   # under 5 steps in the window


@pytest.mark.parametrize("known", [1.0, 0.5, 0.0])
def test_a_known_elasticity_is_read_back(known):
    interp = [0.5 * s for s in SPEEDS]   # ms per window: the loop's time moves with the speed
    ratios = step_ratio_by_window(steps_at(SPEEDS, known), lambda b, c: 0.004, 100.0, 1.0, len(SPEEDS))
    read = elasticity(interp, ratios)
    assert read.windows == len(SPEEDS) and read.slope == pytest.approx(known, abs=1e-6)
    # the slowest third of windows by the loop (1.5, 1.5, 1.6) against the fastest (three of 1.0)
    assert read.interp_slow_over_fast == pytest.approx(4.6 / 3)
    assert read.step_slow_over_fast == pytest.approx(sum(s ** known for s in (1.5, 1.5, 1.6)) / 3)
    assert read.correlation == pytest.approx(1.0 if known else 0.0)


def test_too_few_windows_or_a_still_interpreter_read_no_elasticity():
    assert elasticity([1.0] * 3, [1.0] * 3) is None
    assert elasticity([1.0] * 10, [1.0, 2.0] * 5) is None   # the loop never moved: nothing to read
    assert elasticity([1.0, None] * 10, [1.0] * 20) is None   # 10 pairs known but the loop still


def test_a_workers_series_is_its_cores_mean_and_its_elasticity_is_read_through_it():
    assert decode_core_series({0: [1.0, None, 2.0], 1: [3.0, 4.0, None]}, [0, 1]) == [2.0, 4.0, 2.0]
    assert decode_core_series({0: [1.0]}, [5]) == []
    series = InterpreterSeries({1: [0.5 * s for s in SPEEDS], 0: [0.5] * len(SPEEDS)}, 100.0, 1.0,
                               {"decode-0": (1,), "prefill-0": (0,)})
    read = worker_elasticity(steps_at(SPEEDS, 1.0), lambda b, c: 0.004, series, "decode-0")
    assert read.slope == pytest.approx(1.0)
    assert worker_elasticity(steps_at(SPEEDS, 1.0), lambda b, c: 0.004, series, "prefill-0") is None   # still core
