"""The profile's second look at rows off their table's fit: the decision with plain values, and the
job's adapter driving a probe that answers from a script (the engine itself is timed by the
integration profile test)."""

from __future__ import annotations

import asyncio

import pytest

from planner.profile import DecodeSample, PrefillSample
from planner.profiler.job import _second_look
from planner.profiler.plan import ProfilePlan
from planner.profiler.second_look import SECOND_LOOKS, kept_s, kept_span, rows_off_the_fit


def test_rows_more_than_the_tolerance_off_are_picked_worst_first():
    measured = [0.030, 0.070, 0.379, 0.720, 0.100]
    fitted = [0.031, 0.075, 0.303, 0.780, 0.111]  # +3%, +7%, -20%, +8.3%, +11%
    assert rows_off_the_fit(measured, fitted) == [2, 4]
    assert rows_off_the_fit(measured, fitted, tolerance=0.05) == [2, 4, 3, 1]
    assert rows_off_the_fit(measured, measured) == []


def test_a_row_measured_at_zero_is_always_off_and_mismatched_tables_are_refused():
    assert rows_off_the_fit([0.0, 0.02], [0.01, 0.02]) == [0]
    with pytest.raises(ValueError, match="2 measured rows against 1 fitted"):
        rows_off_the_fit([0.01, 0.02], [0.01])


def test_the_kept_time_keeps_the_span_it_was_read_over():
    spans = [(0.0, 1.0), (10.0, 11.0), (20.0, 21.0)]
    assert kept_span([0.379, 0.312, 0.318], spans) == (20.0, 21.0)   # the median, 0.318, was read third
    assert kept_span([0.379, 0.312], spans[:2]) == (0.0, 11.0)       # an even count keeps the two middles' mean
    assert kept_span([0.379], spans[:1]) == (0.0, 1.0)
    with pytest.raises(ValueError, match="2 measurements against 1 spans"):
        kept_span([0.1, 0.2], spans[:1])


def test_one_slow_stretch_is_outvoted_and_a_real_bend_stays():
    assert kept_s(0.379, [0.312, 0.318]) == 0.318   # the first read ran slow: the two agree
    assert kept_s(0.271, [0.268, 0.275]) == 0.271   # a bend measured the same again stays
    assert kept_s(0.379, []) == 0.379


class ScriptedProbe:
    """Answers `prefill_s` and `decode` from the times given per point, in turn; records the calls."""

    def __init__(self, prefill: dict[int, list[float]], decode: dict[tuple[int, int], list[float]]) -> None:
        self.prefill, self.decode_times, self.calls = prefill, decode, []
        self.last_span_s = (0.0, 0.0)

    async def prefill_s(self, prompt_tokens: int, repeats: int) -> float:
        self.calls.append(("prefill", prompt_tokens))
        self.last_span_s = (float(len(self.calls)), len(self.calls) + 0.5)   # as decode's
        return self.prefill[prompt_tokens].pop(0)

    async def decode(self, batch: int, context: int, steps: int):
        self.calls.append(("decode", batch, context))
        read_at = float(len(self.calls))   # the n-th call reads over [n, n + 0.5] s

        class Measured:
            step_s = self.decode_times[(batch, context)].pop(0)
            start_s, end_s = read_at, read_at + 0.5
        return Measured


def test_the_job_measures_again_only_the_rows_off_the_fit_and_keeps_the_median():
    prompts = (32, 64, 128, 256, 512, 1024, 2048)
    points = tuple((b, c) for b in (1, 2, 4, 8) for c in (16, 512))
    plan = ProfilePlan(prefill_prompt_tokens=prompts, prefill_repeats=3, decode_points=points, decode_steps=32,
                       transfer_blocks=(1, 16), transfer_repeats=5)
    # a clean quadratic table with the 1,024-token prompt read 25% slow, and a linear decode table
    # with (batch 2, 16 tokens) read 30% slow
    prefill = [PrefillSample(n, 2048, 0.02 + 1e-4 * n + 2e-8 * n * n) for n in prompts]
    slow_prompt = prefill[5].prefill_s
    prefill[5] = PrefillSample(1024, 2048, slow_prompt * 1.25)
    decode = [DecodeSample(b, b * (c + 16), 0.015 + 2e-4 * b + 5e-7 * b * (c + 16)) for b, c in points]
    slow_step = decode[2].step_s
    decode[2] = DecodeSample(2, decode[2].context_tokens, slow_step * 1.3, start_s=0.1, end_s=0.2)
    probe = ScriptedProbe({1024: [slow_prompt * 1.01, slow_prompt * 0.99]}, {(2, 16): [slow_step, slow_step * 1.02]})
    notes = []

    new_prefill, new_decode = asyncio.run(_second_look(probe, plan, list(prefill), list(decode),
                                                       lambda label, step=True: notes.append((label, step))))

    assert probe.calls == [("prefill", 1024)] * SECOND_LOOKS + [("decode", 2, 16)] * SECOND_LOOKS
    assert new_prefill[5].prefill_s == pytest.approx(slow_prompt * 1.01, abs=1e-7)
    assert (new_prefill[5].start_s, new_prefill[5].end_s) == (1.0, 1.5)   # the first look again, the 1st call
    assert new_decode[2].step_s == pytest.approx(slow_step * 1.02, abs=1e-7)
    assert new_decode[2].context_tokens == decode[2].context_tokens
    # the row keeps when its kept time was read: the second look's second read, the 4th call
    assert (new_decode[2].start_s, new_decode[2].end_s) == (4.0, 4.5)
    assert [r for i, r in enumerate(new_prefill) if i != 5] == [r for i, r in enumerate(prefill) if i != 5]
    assert [r for i, r in enumerate(new_decode) if i != 2] == [r for i, r in enumerate(decode) if i != 2]
    assert len(notes) == 2 and all(not step and label.startswith("second look: ") for label, step in notes)
    assert "prefill 1024 tokens" in notes[0][0] and "decode batch 2 x 16 tokens" in notes[1][0]
