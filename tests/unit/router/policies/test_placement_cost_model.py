"""The cost model's formulas, its validation, and the online prefill fit's recovery and fallbacks."""

import pytest

import random

from router.policies.placement.cost import CostModel, OnlinePrefillFit, prior_units

COST = CostModel(fixed_s=0.01, per_token_s=1e-4, per_token2_s=1e-9, step_fixed_s=0.02, step_per_seq_s=0.001,
                 transfer_fixed_s=0.005, transfer_per_token_s=1e-5, local_interference_per_decode=0.05)
PRIOR = CostModel(fixed_s=0.5, per_token_s=0.5, per_token2_s=0.5, step_fixed_s=0.02, step_per_seq_s=0.001)


def test_prefill_has_fixed_linear_and_quadratic_terms():
    assert COST.prefill_s(1000) == pytest.approx(0.01 + 0.1 + 0.001)
    assert COST.prefill_s(8000) == pytest.approx(0.01 + 0.8 + 0.064)


def test_prior_units_sum_each_chunk_times_the_tokens_before_it():
    # chunks [0, 300), [300, 600), [600, 900), [900, 1000): 0 + 300*300 + 300*600 + 100*900
    assert prior_units(1000, 300) == 360_000
    assert (prior_units(256, 256), prior_units(257, 256), prior_units(0, 256)) == (0, 256, 0)
    rng = random.Random(7)
    for _ in range(200):
        n, k = rng.randint(1, 5000), rng.randint(1, 600)
        assert prior_units(n, k) == sum(min(k, n - s) * s for s in range(0, n, k))
    with pytest.raises(ValueError, match="chunk_tokens must be > 0"):
        prior_units(100, 0)


def test_a_chunked_prefill_pays_a_steps_overhead_per_chunk_and_its_queries_over_earlier_chunks():
    chunked = CostModel(fixed_s=0.01, per_token_s=1e-4, per_token2_s=1e-9, step_fixed_s=0.02, step_per_seq_s=0.001,
                        chunk_tokens=256, per_chunk_s=0.004, per_prior_unit_s=2e-9)
    assert chunked.prefill_s(256) == pytest.approx(COST.prefill_s(256))  # one chunk: as unchunked
    # 1000 tokens: chunks of 256, 256, 256, 232; three more steps, prior units 256*256*(0+1+2) + 232*768
    assert chunked.prefill_s(1000) == pytest.approx(COST.prefill_s(1000) + 3 * 0.004 + 2e-9 * (196_608 + 178_176))
    assert CostModel(**{**vars(chunked), "chunk_tokens": 0}).prefill_s(1000) == pytest.approx(COST.prefill_s(1000))


def test_chunks_may_cost_less_than_one_pass_over_earlier_tokens_but_never_less_than_nothing():
    base = dict(fixed_s=0.01, per_token_s=1e-4, per_token2_s=1e-9, step_fixed_s=0.02, step_per_seq_s=0.001,
                chunk_tokens=256, per_chunk_s=0.004)
    cheaper = CostModel(**base, per_prior_unit_s=-1.5e-9)
    assert cheaper.prefill_s(1000) == pytest.approx(COST.prefill_s(1000) + 3 * 0.004 - 1.5e-9 * (196_608 + 178_176))
    costs = [CostModel(**base, per_prior_unit_s=-2e-9).prefill_s(n) for n in range(0, 3000, 7)]
    assert all(later >= earlier for earlier, later in zip(costs, costs[1:]))   # still non-decreasing at -2c
    with pytest.raises(ValueError,
                       match=r"per_prior_unit_s must be a finite number >= -2 \* per_token2_s, got -2.1e-09"):
        CostModel(**base, per_prior_unit_s=-2.1e-9)
    with pytest.raises(ValueError, match=r"per_prior_unit_s must be a finite number >= -2 \* per_token2_s, got nan"):
        CostModel(**base, per_prior_unit_s=float("nan"))


def test_decode_step_and_transfer_are_affine():
    assert COST.decode_step_s(8) == pytest.approx(0.028)
    assert COST.kv_transfer_s(4000) == pytest.approx(0.045)


def test_nothing_to_do_costs_nothing_even_with_fixed_costs():
    assert (COST.prefill_s(0), COST.decode_step_s(0), COST.kv_transfer_s(0)) == (0.0, 0.0, 0.0)


def test_local_prefill_slows_down_with_each_running_decode():
    assert COST.local_prefill_slowdown(0) == 1.0
    assert COST.local_prefill_slowdown(8) == pytest.approx(1.4)


def test_a_negative_coefficient_is_refused_with_the_field_named():
    with pytest.raises(ValueError, match=r"CostModel.per_token_s must be a finite number >= 0, got -1"):
        CostModel(fixed_s=0.0, per_token_s=-1, step_fixed_s=0.0, step_per_seq_s=0.0)
    with pytest.raises(ValueError, match="CostModel.fixed_s"):
        CostModel(fixed_s=float("nan"), per_token_s=0.0, step_fixed_s=0.0, step_per_seq_s=0.0)


def _fit_of(samples, **kwargs) -> OnlinePrefillFit:
    fit = OnlinePrefillFit(**kwargs)
    for num_tokens, seconds in samples:
        fit.observe(num_tokens, seconds)
    return fit


SHAPE = CostModel(fixed_s=0.03, per_token_s=1e-3, per_token2_s=2e-7, step_fixed_s=0.02, step_per_seq_s=0.001)


def test_the_fit_recovers_an_offset_and_a_scale_of_the_priors_curve_and_keeps_the_rest_of_the_prior():
    # this worker: 40 ms of serving on every prefill, and computing 1.5x slower than the profile
    model = _fit_of([(n, 0.04 + 1.5 * SHAPE.prefill_s(n)) for n in (64, 128, 256, 512, 1024)]).model(SHAPE)
    assert model.fixed_s == pytest.approx(0.04 + 1.5 * 0.03, rel=1e-6)
    assert model.per_token_s == pytest.approx(1.5e-3, rel=1e-6)
    assert model.per_token2_s == pytest.approx(3e-7, rel=1e-6)
    assert (model.step_fixed_s, model.step_per_seq_s) == (0.02, 0.001)


def test_the_fit_scales_a_chunked_priors_chunk_terms_with_the_rest_of_its_curve():
    prior = CostModel(**{**vars(SHAPE), "chunk_tokens": 256, "per_chunk_s": 0.01, "per_prior_unit_s": 1e-7})
    model = _fit_of([(n, 0.04 + 1.5 * prior.prefill_s(n)) for n in (64, 128, 256, 512, 1024, 2000)]).model(prior)
    assert (model.per_chunk_s, model.per_prior_unit_s) == pytest.approx((0.015, 1.5e-7), rel=1e-6)
    assert model.prefill_s(1500) == pytest.approx(0.04 + 1.5 * prior.prefill_s(1500), rel=1e-6)


def test_short_prompts_with_noise_predict_a_long_one_as_the_priors_shape_does():
    """The regression: a free quadratic fitted on chat-sized prompts with 30 ms of noise put a
    2,000-token prefill anywhere in 2.5-7 s (true: 3.06 s), and admission refused servable work."""
    sizes = [374, 396, 91, 91, 381, 388, 242, 209, 394, 394, 389, 415, 120, 369, 206, 197]
    noise = [0.03, -0.02, 0.01, -0.03, 0.025, -0.01, 0.02, -0.025, 0.0, 0.015, -0.015, 0.03, -0.03, 0.01, 0.0, -0.01]
    model = _fit_of([(n, 0.05 + SHAPE.prefill_s(n) + e) for n, e in zip(sizes, noise)]).model(SHAPE)
    assert model.prefill_s(2000) == pytest.approx(0.05 + SHAPE.prefill_s(2000), rel=0.1)


def test_the_fit_averages_noise_over_repeated_sizes():
    samples = [(n, 2 * SHAPE.prefill_s(n) + noise) for n in (100, 200, 400, 800) for noise in (-0.001, 0.001)]
    model = _fit_of(samples).model(SHAPE)
    assert model.prefill_s(1500) == pytest.approx(2 * SHAPE.prefill_s(1500), rel=1e-3)
    assert model.fixed_s == pytest.approx(0.06, abs=1e-3)


def test_with_fewer_distinct_sizes_than_needed_the_prior_is_returned():
    fit = _fit_of([(100, 0.02), (100, 0.021), (200, 0.03), (200, 0.031)])
    assert fit.model(PRIOR) is PRIOR
    fit.observe(400, 0.05)
    assert fit.model(PRIOR) is not PRIOR


def test_a_negative_offset_falls_back_to_a_scale_alone_never_a_negative_coefficient():
    # faster than the prior by more at small sizes than at large: the line would cross below 0
    model = _fit_of([(n, SHAPE.prefill_s(n) - 0.02) for n in (100, 400, 900, 1600)]).model(SHAPE)
    assert model.fixed_s == pytest.approx(SHAPE.fixed_s * model.per_token_s / SHAPE.per_token_s)
    assert 0 < model.per_token_s < SHAPE.per_token_s


def test_sizes_too_close_together_get_a_scale_alone():
    model = _fit_of([(n, 2 * SHAPE.prefill_s(n)) for n in (1000, 1001, 1002)]).model(SHAPE)
    assert model.per_token_s == pytest.approx(2e-3, rel=1e-6) and model.fixed_s == pytest.approx(0.06, rel=1e-6)


def test_only_the_last_window_of_observations_counts():
    slow = [(n, 3 * SHAPE.prefill_s(n)) for n in (100, 200, 300)]
    fast = [(n, 0.5 * SHAPE.prefill_s(n)) for n in (100, 200, 300)]
    fit = _fit_of(slow + fast, window=3)
    assert len(fit) == 3
    assert fit.model(SHAPE).prefill_s(300) == pytest.approx(0.5 * SHAPE.prefill_s(300), rel=1e-6)


def test_an_impossible_observation_is_refused():
    fit = OnlinePrefillFit()
    for num_tokens, seconds in ((0, 0.1), (10, -0.1), (10, float("inf"))):
        with pytest.raises(ValueError, match="an observation needs"):
            fit.observe(num_tokens, seconds)
    assert len(fit) == 0
