"""The validation's workload shapes: each fits the model's context and has the character it is named for."""

from __future__ import annotations

import numpy as np
import pytest

from planner.validation_shapes import SHAPE_NAMES, Uniform, validation_shapes


@pytest.mark.parametrize("max_model_len", [1024, 2048, 4096])
def test_every_shape_fits_the_context(max_model_len):
    shapes = validation_shapes(max_model_len)
    assert tuple(shapes) == SHAPE_NAMES
    for shape in shapes.values():
        requests = shape.workload.build(rate_rps=2.0, num_requests=300)
        assert len(requests) == 300
        assert max(r.prompt_tokens + r.output_tokens for r in requests) <= max_model_len, shape.name


def test_the_long_short_shape_is_prefill_heavy_and_the_short_long_one_decode_heavy():
    shapes = validation_shapes(2048)
    long_short = shapes["long-short"].workload.build(rate_rps=1.0, num_requests=200)
    short_long = shapes["short-long"].workload.build(rate_rps=1.0, num_requests=200)
    assert min(r.prompt_tokens for r in long_short) >= 0.45 * 2048
    assert max(r.output_tokens for r in long_short) <= 32
    assert np.mean([r.output_tokens / r.prompt_tokens for r in short_long]) > 2


def test_the_bursty_shape_has_gaps_three_times_as_spread_as_their_mean():
    bursty = validation_shapes(2048)["bursty"].workload.build(rate_rps=4.0, num_requests=2000)
    uniform = validation_shapes(2048)["uniform"].workload.build(rate_rps=4.0, num_requests=2000)
    gaps = np.diff([r.arrival_s for r in bursty])
    assert 2.4 < gaps.std() / gaps.mean() < 3.6
    assert [r.prompt_tokens for r in bursty] == [r.prompt_tokens for r in uniform]  # same lengths, other arrivals


def test_lengths_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        validation_shapes(1024, Uniform(input_len=800, output_len=200, range_ratio=0.5))
    with pytest.raises(ValueError, match=">= 512"):
        validation_shapes(256)
