"""A request's first decode steps over its steady step (`planner.profiler.join_warmup`), on traced
steps and rows made by hand."""

from __future__ import annotations

import pytest

from pdserve.engine_step_trace import TracedStep
from planner.profiler.join_warmup import (MIN_STEADY, STEADY_FROM, WARM_STEPS, fit_join_warmup, warmup_excess_s,
                                          warmup_lines)


def run(start_s: float, context: int, durations_s: list[float], join_s: float = 0.006) -> list[TracedStep]:
    """One request alone: its join step, then a step of each duration, back to back."""
    steps = [TracedStep(start_s, start_s + join_s, 1, 0, 1, 1, context)]
    t = start_s + join_s
    for i, d in enumerate(durations_s):
        steps.append(TracedStep(t, t + d, 0, 1, 1, 1, context + 1 + i))
        t += d
    return steps


def test_the_excess_is_the_warm_steps_over_the_runs_own_steady_step():
    warm = [0.0052, 0.0050, 0.0046, 0.0044] + [0.0041] * (WARM_STEPS - 4)
    steps = run(0.0, 1433, warm + [0.0040] * 30)
    [(context, excess_s)] = warmup_excess_s(steps)
    assert context == 1433
    assert excess_s == pytest.approx(sum(d - 0.0040 for d in warm))   # steps from STEADY_FROM on: 0.0040


def test_a_run_too_short_to_show_its_steady_step_or_not_alone_is_not_read():
    short = run(0.0, 500, [0.004] * (STEADY_FROM + MIN_STEADY - 1))
    assert warmup_excess_s(short) == []
    crowded = run(10.0, 500, [0.004] * 40)
    crowded[20] = TracedStep(crowded[20].start_s, crowded[20].end_s, 0, 2, 2, 2, 1000)   # a second sequence
    assert warmup_excess_s(crowded) == []   # what is left after the step with two is not a join's run
    a, b = run(20.0, 128, [0.005] * 3 + [0.004] * 40), run(30.0, 1024, [0.006] * 3 + [0.004] * 40)
    assert [context for context, _ in warmup_excess_s(a + b)] == [128, 1024]


def test_the_fit_recovers_a_line_through_each_contexts_median():
    intercept, slope = 0.0012, 3.0e-6
    rows = [(c, intercept + slope * c + noise) for c in (128, 1024) for noise in (-0.0005, 0.0, 0.0004)]
    assert fit_join_warmup(rows) == pytest.approx((intercept, slope))
    assert any("1024-token context: 3 runs" in line for line in warmup_lines(rows, fit_join_warmup(rows)))


def test_the_fit_keeps_both_terms_nonnegative_and_needs_two_runs_of_a_context():
    falling = [(128, 0.004), (128, 0.004), (1024, 0.002), (1024, 0.002)]
    assert fit_join_warmup(falling) == pytest.approx((0.003, 0.0))   # no negative slope: the mean, all fixed
    through_origin = [(128, 0.0001), (128, 0.0001), (1024, 0.004), (1024, 0.004)]
    intercept, slope = fit_join_warmup(through_origin)
    assert intercept == 0.0 and slope > 0
    assert fit_join_warmup([(128, 0.004), (1024, 0.002)]) is None
    assert fit_join_warmup([(128, 0.004), (128, 0.002), (1024, 0.009)]) == pytest.approx((0.003, 0.0))


def test_a_warmup_probe_that_breaks_leaves_the_profile_without_it_and_says_why(monkeypatch, tmp_path):
    from pdserve.errors import NoHealthyWorker
    from planner.profiler import serving_probe
    from planner.profiler.serving_fit import serving_plan

    async def broken(*args, **kwargs):
        raise NoHealthyWorker("the decode pool went away")

    notes = []
    monkeypatch.setattr(serving_probe, "lone_runs", broken)
    plan = serving_plan(max_model_len=2048, max_num_seqs=64, quick=True)
    terms = serving_probe.measure_join_warmup("localhost:1", tmp_path, "decode-1", plan, 100,
                                              lambda note, step=True: notes.append((note, step)))
    assert terms == {}
    assert notes == [(notes[0][0], False)] and "NoHealthyWorker: the decode pool went away" in notes[0][0]


def test_a_trace_without_runs_gives_no_terms_and_a_note(monkeypatch, tmp_path):
    from planner.profiler import serving_probe
    from planner.profiler.serving_fit import serving_plan

    async def quiet(*args, **kwargs):
        return []

    notes = []
    monkeypatch.setattr(serving_probe, "lone_runs", quiet)
    plan = serving_plan(max_model_len=2048, max_num_seqs=64, quick=True)
    assert serving_probe.measure_join_warmup("localhost:1", tmp_path, "decode-1", plan, 100,
                                             lambda note, step=True: notes.append(note)) == {}
    assert any("no request's first decode steps could be read" in note for note in notes)
