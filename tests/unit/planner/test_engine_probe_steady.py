"""`steady_decode` on hand-made output times: the decode step of a batch, with plain values."""

from __future__ import annotations

import pytest

from planner.profiler.engine_probe import steady_decode


def marks(start_s: float, times_s: list[float]) -> list[tuple[float, int]]:
    """One output per time, one token each: (time, tokens so far)."""
    return [(start_s + t, n) for n, t in enumerate(times_s, start=1)]


def test_the_steps_that_compute_another_prompt_are_left_out():
    # two 4,000-token prompts in 2,048-token chunks: the first decodes two tokens during the
    # second's two 1.3 s prefill steps, then both decode 20 ms steps; the second starts at 3.9 s
    first = marks(0.0, [1.3, 2.6, 3.9] + [3.9 + 0.02 * k for k in range(1, 31)])
    second = marks(3.9, [0.0] + [0.02 * k for k in range(1, 31)])
    measured = steady_decode([first, second], batch_size=2, context_per_seq=4000, steps=32)
    assert measured.step_s == pytest.approx(0.02)  # the old rule timed the first over all its tokens (0.14 s)
    assert measured.batch_size == 2 and 2 * 4000 < measured.context_tokens < 2 * 4033
    # the stretch read: from the first token past the second's second token (3.92 s) to the last
    assert (measured.start_s, measured.end_s) == pytest.approx((3.94, 4.5))


def test_a_request_without_a_steady_stretch_is_timed_first_token_to_last():
    # the first finishes before the second's second token: no steady stretch, its TPOT is used
    first = marks(0.0, [0.1 * k for k in range(5)])
    second = marks(0.45, [0.0, 0.1, 0.2, 0.3, 0.4])
    measured = steady_decode([first, second], batch_size=2, context_per_seq=100, steps=4)
    assert measured.step_s == pytest.approx(0.1)
    assert (measured.start_s, measured.end_s) == pytest.approx((0.0, 0.85))


def test_no_request_that_produced_two_outputs_is_an_error():
    with pytest.raises(RuntimeError, match="no request produced two outputs"):
        steady_decode([[(0.0, 1)]], batch_size=1, context_per_seq=10, steps=4)
