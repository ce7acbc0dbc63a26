"""What a loaded decode worker's gap is made of (planner.validation_steps), with plain values: a
trace of hand-made steps against a model of round numbers."""

from __future__ import annotations

import math

import numpy as np

import pytest

from pdserve.engine_step_trace import TracedStep
from planner.validation_steps import (between_s, client_steady_gap_s, cycle_summary, decode_steps,
                                      decode_worker_summary, step_rows)


def model_step_s(batch: int, context_tokens: int) -> float:
    return 0.004 + 0.001 * batch + 1e-6 * context_tokens


def served_s(batch: int) -> float:
    return 0.0005 + 0.0001 * batch


def step(start_s, duration_s, joined, continuing, context_tokens=0, prompt_tokens=0):
    """A decode step (every request computes one token) or, with `prompt_tokens`, a prompt's step."""
    tokens = prompt_tokens or joined + continuing
    return TracedStep(start_s, start_s + duration_s, joined, continuing, tokens,
                      0 if prompt_tokens else joined + continuing, context_tokens)


# a prompt's step, a join (two pulled requests), three steps of two continuing, then the engine idles
# 0.5 s and a lone request's step runs
STEPS = [step(0.000, 0.050, 1, 0, prompt_tokens=100, context_tokens=100),
         step(0.100, 0.010, 2, 0, context_tokens=1000),
         step(0.112, 0.008, 0, 2, context_tokens=1000),
         step(0.121, 0.008, 0, 2, context_tokens=1000),
         step(0.130, 0.007, 0, 2, context_tokens=1000),
         step(0.637, 0.006, 0, 1, context_tokens=500)]


def test_the_time_between_steps_counts_only_where_the_next_step_continues_a_request():
    gaps = between_s(STEPS)
    assert gaps[1:4] == pytest.approx([0.002, 0.001, 0.001])
    assert math.isnan(gaps[0])     # the step after the prompt's joined requests, continued none: not counted
    assert gaps[4] == pytest.approx(0.5)   # the lone step continues a request: the engine waited on it
    assert math.isnan(gaps[5])     # the last step


def test_decode_steps_leave_out_prompt_steps_and_steps_outside_the_window():
    assert decode_steps(STEPS) == [1, 2, 3, 4, 5]
    assert decode_steps(STEPS, 0.11, 0.6) == [2, 3, 4]


def test_rows_group_steps_by_batch_and_join_with_their_model_and_served_extra():
    rows = step_rows(STEPS, decode_steps(STEPS), model_step_s, served_s)
    assert [(r.label, r.joins, r.steps) for r in rows] == [("1", False, 1), ("2-3", False, 3), ("2-3", True, 1)]
    two = rows[1]
    assert two.step_s == pytest.approx(0.023 / 3)
    assert two.model_s == pytest.approx(0.004 + 0.002 + 0.001)
    assert two.stretch == pytest.approx(0.023 / 3 / 0.007)
    assert two.between_s == pytest.approx((0.001 + 0.001 + 0.5) / 3)
    assert two.served_s == pytest.approx(0.0007)
    assert rows[2].between_s == pytest.approx(0.002) and rows[2].step_s == pytest.approx(0.010)


def test_the_cycle_weighs_each_step_by_its_tokens_and_skips_gaps_after_which_the_engine_idled():
    window = decode_steps(STEPS, 0.0, 0.2)      # the join and the three steps of two
    summary = cycle_summary(STEPS, window, model_step_s, served_s)
    assert summary.tokens == 8
    assert summary.step_s == pytest.approx((0.010 + 0.008 + 0.008 + 0.007) * 2 / 8)
    assert summary.model_s == pytest.approx(0.007)
    # every one of the four is followed by a continuing step: (0.002 + 0.001 + 0.001 + 0.5) x 2 / 8
    assert summary.between_s == pytest.approx(0.504 / 4)
    assert summary.cycle_s == pytest.approx(summary.step_s + summary.between_s)
    empty = cycle_summary(STEPS, [], model_step_s, served_s)
    assert empty.tokens == 0 and math.isnan(empty.cycle_s)


def test_the_clients_gap_is_token_weighted_over_requests_of_three_tokens_or_more():
    # (0.3 - 0.1) / 2 tokens and (1.0 - 0.2) / 8: 1.0 s over 10 tokens; a two-token request adds nothing
    gap = client_steady_gap_s([(0.0, 0.1, 0.2, 0.3), (0.0, 0.2) + tuple(0.2 + 0.1 * i for i in range(1, 9)),
                               (0.0, 0.5)], [4, 10, 2])
    assert gap == pytest.approx(1.0 / 10)
    assert math.isnan(client_steady_gap_s([(0.0, 0.5)], [2]))


def test_a_workers_summary_is_in_milliseconds_with_its_rows_and_busy_share():
    summary = decode_worker_summary(STEPS, 0.0, 0.2, model_step_s, served_s)
    assert summary["steps"] == 4 and summary["tokens"] == 8
    assert summary["model_ms"] == pytest.approx(7.0)
    assert summary["busy_share"] == pytest.approx((0.050 + 0.010 + 0.008 + 0.008 + 0.007) / 0.2)
    assert [row["batch"] for row in summary["rows"]] == ["2-3", "2-3"]
    assert summary["rows"][1]["joins"] is True


def test_the_step_extra_fit_recovers_known_terms_and_leaves_joins_and_prompts_out():
    from planner.validation_steps import fit_step_extra

    rng = np.random.default_rng(0)
    steps, t = [], 0.0
    for _ in range(400):
        batch, context = int(rng.integers(1, 40)), int(rng.integers(100, 20_000))
        duration = model_step_s(batch, context) + 0.0009 + 0.00017 * batch + 5e-8 * context
        steps.append(step(t, duration, 0, batch, context_tokens=context))
        t += duration + 0.0001
    steps.append(step(t, 0.5, 1, 3, context_tokens=300))                    # a join: left out
    steps.append(step(t + 1, 0.5, 1, 0, prompt_tokens=900, context_tokens=900))   # a prompt: left out
    fit = fit_step_extra(steps, model_step_s)
    assert fit.steps == 400 and fit.mean_abs_error == pytest.approx(0.0, abs=1e-9)
    assert (fit.per_step_s, fit.per_seq_s, fit.per_context_token_s) == pytest.approx((0.0009, 0.00017, 5e-8), rel=1e-6)
    assert fit.extra_s(10, 1000) == pytest.approx(0.0009 + 0.0017 + 5e-5)
    flat = fit_step_extra(steps, model_step_s, with_context=False)
    assert flat.per_context_token_s == 0.0 and flat.mean_abs_error > 0   # the context's part is missed
    with pytest.raises(ValueError, match="too few"):
        fit_step_extra(steps[-2:], model_step_s)


def test_a_prefill_workers_prompt_steps_are_set_against_the_models_prompt_step():
    from planner.validation_steps import prefill_worker_summary, prompt_steps

    def prompt_model(tokens, units):
        return 0.005 + 1e-5 * tokens + 1e-9 * units

    steps = [step(0.0, 0.012, 1, 0, context_tokens=500, prompt_tokens=500),      # model 0.01025: x1.17
             step(0.1, 0.040, 2, 0, context_tokens=2000, prompt_tokens=2000),    # two of 1000: 0.027, x1.48
             step(0.2, 0.003, 0, 1, context_tokens=501),                         # a decode step: not a prompt's
             step(0.3, 0.030, 1, 0, context_tokens=1000, prompt_tokens=1000)]    # outside the window below
    assert prompt_steps(steps) == [0, 1, 3] and prompt_steps(steps, 0.0, 0.25) == [0, 1]
    summary = prefill_worker_summary(steps, 0.0, 0.25, prompt_model)
    assert summary["steps"] == 2 and summary["several_prompts"] == 1
    assert summary["model_ms"] == pytest.approx((10.25 + 27.0) / 2)
    assert summary["median_stretch"] == pytest.approx((0.012 / 0.01025 + 0.040 / 0.027) / 2, rel=1e-3)
    assert summary["busy_share"] == pytest.approx(0.055 / 0.25)
    assert prefill_worker_summary(steps, 5.0, 6.0, prompt_model) == {"steps": 0, "busy_share": 0.0}


def test_prompt_steps_are_grouped_by_the_batch_the_decode_worker_was_streaming():
    from planner.validation_steps import prompt_stretch_by_decode_batch

    def prompt_model(tokens, units):
        return 0.010   # every prompt: 10 ms

    # the decode worker: idle until 1 s, then batch 2 (steps of 5 ms back to back) to 2 s, then batch 8 to 3 s
    decode = ([step(1.0 + 0.005 * k, 0.005, 0, 2) for k in range(200)]
              + [step(2.0 + 0.005 * k, 0.005, 0, 8) for k in range(200)])
    prompts = ([step(0.1 * k, 0.011, 1, 0, prompt_tokens=100) for k in range(1, 8)]           # idle: x1.1
               + [step(1.0 + 0.1 * k + 0.001, 0.015, 1, 0, prompt_tokens=100) for k in range(6)]   # batch 2: x1.5
               + [step(2.0 + 0.1 * k + 0.001, 0.030, 1, 0, prompt_tokens=100) for k in range(6)]   # batch 8: x3
               + [step(2.8, 0.050, 1, 0, prompt_tokens=100)])                                      # one more at 8
    by_batch = prompt_stretch_by_decode_batch(prompts, decode, 0.0, 3.0, prompt_model)
    assert list(by_batch) == ["0", "2-3", "8-15"]
    assert by_batch["0"] == {"steps": 7, "median_stretch": pytest.approx(1.1)}
    assert by_batch["2-3"]["median_stretch"] == pytest.approx(1.5) and by_batch["8-15"]["steps"] == 7
    assert by_batch["8-15"]["median_stretch"] == pytest.approx(3.0)
    # a bucket with fewer steps than asked is left out; the window bounds the prompts
    assert list(prompt_stretch_by_decode_batch(prompts, decode, 0.0, 3.0, prompt_model, min_steps=8)) == []
    assert list(prompt_stretch_by_decode_batch(prompts, decode, 1.0, 2.0, prompt_model)) == ["2-3"]
    assert "lost_ms" not in by_batch["0"]   # every prompt 10 ms in the model: no length to read a line over


def test_a_prompt_steps_loss_splits_into_a_fixed_part_and_a_slope():
    from planner.validation_steps import prompt_stretch_by_decode_batch, step_loss_fit

    model = np.array([0.010, 0.020, 0.040, 0.080, 0.010, 0.040])
    measured = 0.004 + 1.25 * model
    lost_s, slope, error = step_loss_fit(model, measured)
    assert lost_s == pytest.approx(0.004, abs=1e-6) and slope == pytest.approx(1.25, rel=1e-4) and error < 1e-4
    # one step a pause tripled does not move the line (least absolute deviations)
    noisy = measured.copy()
    noisy[2] *= 3
    lost_s, slope, error = step_loss_fit(model, noisy)
    assert lost_s == pytest.approx(0.004, abs=2e-4) and slope == pytest.approx(1.25, rel=0.02)
    assert error == pytest.approx((2 / 3) / 6, rel=0.05)   # the tripled step misses by 2/3 of itself, the rest by ~0
    # lengths spanning under 2x, or under 3 steps: no line
    assert step_loss_fit(model[:1].repeat(4) * [1, 1.2, 1.5, 1.9], measured[:4]) is None
    assert step_loss_fit(model[:2], measured[:2]) is None

    def prompt_model(tokens, units):
        return tokens * 1e-4   # 100 tokens: 10 ms

    decode = [step(1.0 + 0.005 * k, 0.005, 0, 8) for k in range(400)]   # batch 8 from 1 s to 3 s
    lengths = [100, 200, 400, 800, 100, 400]
    prompts = [step(1.0 + 0.3 * k + 0.001, 0.006 + 2.0 * n * 1e-4, 1, 0, prompt_tokens=n)
               for k, n in enumerate(lengths)]
    row = prompt_stretch_by_decode_batch(prompts, decode, 0.0, 3.0, prompt_model)["8-15"]
    assert row["lost_ms"] == pytest.approx(6.0, abs=0.01) and row["slope"] == pytest.approx(2.0, rel=1e-3)
    assert row["line_error"] < 1e-3


def test_decode_steps_beside_the_prefill_engines_against_those_alone():
    from planner.validation_steps import corun_by_batch

    # batch 1: ten steps of 6 ms while the prefill engine steps (0-0.06), ten of 4 ms from 0.2 while
    # it idles; batch 2: ten steps, all alone (no pair); a step a request joined is left out
    beside = [step(0.006 * k, 0.006, 0, 1) for k in range(10)]
    alone = [step(0.2 + 0.004 * k, 0.004, 0, 1) for k in range(10)]
    pairs = [step(0.5 + 0.004 * k, 0.004, 0, 2) for k in range(10)]
    prefill = [TracedStep(0.0, 0.03, 1, 0, 500, 0, 500), TracedStep(0.03, 0.06, 1, 0, 500, 0, 500)]
    joined = step(0.061, 0.05, 1, 0)
    rows = corun_by_batch(beside + alone + pairs + [joined], prefill, min_steps=5)
    assert [(r.batch, r.beside_steps, r.alone_steps) for r in rows] == [("1", 10, 10)]
    assert rows[0].beside_s == pytest.approx(0.006) and rows[0].alone_s == pytest.approx(0.004)
    assert rows[0].ratio == pytest.approx(1.5)
    assert corun_by_batch(beside + alone, prefill, min_steps=11) == []     # too few on a side


def test_decode_steps_without_a_join_are_read_over_the_model_and_served_line_on_both_sides():
    from planner.validation_steps import measured_decode_stretch, simulated_decode_stretch_by_batch

    # simulated: (start, duration, model + served, batch, joins); a join's step and a too-thin bucket left out
    steps = [(i, 0.012, 0.010, 1, 0) for i in range(5)] + [(10, 0.05, 0.010, 1, 1)] \
        + [(20 + i, 0.022 + 0.002 * i, 0.020, 9, 0) for i in range(6)] + [(40, 0.03, 0.02, 40, 0)]
    assert simulated_decode_stretch_by_batch(np.array(steps)) == {
        "1": {"steps": 5, "stretch": 1.2}, "8-15": {"steps": 6, "stretch": pytest.approx((6 * 0.022 + 0.030) / 0.12)}}
    # measured: each worker's rows (ms), summed over workers by bucket, join rows left out
    workers = {"decode-0": {"rows": [{"batch": "1", "joins": False, "steps": 10, "step_ms": 3.0, "model_ms": 2.0,
                                      "served_extra_ms": 0.5},
                                     {"batch": "1", "joins": True, "steps": 10, "step_ms": 9.0, "model_ms": 2.0,
                                      "served_extra_ms": 0.5}]},
               "decode-1": {"rows": [{"batch": "1", "joins": False, "steps": 30, "step_ms": 2.5, "model_ms": 2.0,
                                      "served_extra_ms": 0.5},
                                     {"batch": "2-3", "joins": False, "steps": 2, "step_ms": 4.0, "model_ms": 3.0,
                                      "served_extra_ms": 0.5}]}}
    assert measured_decode_stretch(workers) == {"1": {"steps": 40, "stretch": pytest.approx((30 + 75) / 100)}}
    assert simulated_decode_stretch_by_batch(np.zeros((0, 5))) == {} and measured_decode_stretch({}) == {}
