"""The cost model's formulas, its validation, and the online prefill fit's recovery and fallbacks."""

import pytest

from router.policies.placement.cost import CostModel, OnlinePrefillFit

COST = CostModel(fixed_s=0.01, per_token_s=1e-4, per_token2_s=1e-9, step_fixed_s=0.02, step_per_seq_s=0.001,
                 transfer_fixed_s=0.005, transfer_per_token_s=1e-5, local_interference_per_decode=0.05)
PRIOR = CostModel(fixed_s=0.5, per_token_s=0.5, per_token2_s=0.5, step_fixed_s=0.02, step_per_seq_s=0.001)


def test_prefill_has_fixed_linear_and_quadratic_terms():
    assert COST.prefill_s(1000) == pytest.approx(0.01 + 0.1 + 0.001)
    assert COST.prefill_s(8000) == pytest.approx(0.01 + 0.8 + 0.064)


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


def test_the_fit_recovers_known_quadratic_coefficients_and_keeps_the_rest_of_the_prior():
    truth = CostModel(fixed_s=0.01, per_token_s=2e-4, per_token2_s=1e-8, step_fixed_s=0, step_per_seq_s=0)
    model = _fit_of([(n, truth.prefill_s(n)) for n in (64, 128, 256, 512, 1024, 2048, 4096)]).model(PRIOR)
    assert model.fixed_s == pytest.approx(0.01, rel=1e-6)
    assert model.per_token_s == pytest.approx(2e-4, rel=1e-6)
    assert model.per_token2_s == pytest.approx(1e-8, rel=1e-6)
    assert (model.step_fixed_s, model.step_per_seq_s) == (0.02, 0.001)


def test_the_fit_averages_noise_over_repeated_sizes():
    truth = CostModel(fixed_s=0.02, per_token_s=1e-4, per_token2_s=0.0, step_fixed_s=0, step_per_seq_s=0)
    samples = [(n, truth.prefill_s(n) + noise) for n in (100, 200, 400, 800) for noise in (-0.001, 0.001)]
    model = _fit_of(samples).model(PRIOR)
    assert (model.fixed_s, model.per_token_s) == (pytest.approx(0.02, rel=1e-6), pytest.approx(1e-4, rel=1e-6))
    assert model.per_token2_s == pytest.approx(0.0, abs=1e-15)


def test_with_fewer_distinct_sizes_than_needed_the_prior_is_returned():
    fit = _fit_of([(100, 0.02), (100, 0.021), (200, 0.03), (200, 0.031)])
    assert fit.model(PRIOR) is PRIOR
    fit.observe(400, 0.05)
    assert fit.model(PRIOR) is not PRIOR


def test_concave_data_falls_back_to_a_linear_fit_never_a_negative_coefficient():
    # time ~ sqrt(n): the unconstrained quadratic would bend down (negative n^2 coefficient)
    model = _fit_of([(n, 0.001 * n ** 0.5) for n in (100, 400, 900, 1600, 2500)]).model(PRIOR)
    assert model.per_token2_s == 0.0
    assert model.fixed_s > 0 and model.per_token_s > 0


def test_sizes_too_close_together_are_ill_conditioned_and_keep_the_prior():
    assert _fit_of([(1000, 0.11), (1001, 0.1101), (1002, 0.1102)]).model(PRIOR) is PRIOR


def test_sizes_within_ten_percent_get_a_two_term_fit_not_the_ill_conditioned_quadratic():
    truth = CostModel(fixed_s=0.01, per_token_s=1e-4, per_token2_s=1e-8, step_fixed_s=0, step_per_seq_s=0)
    model = _fit_of([(n, truth.prefill_s(n)) for n in (1000, 1050, 1100)]).model(PRIOR)
    # (1, n, n^2) has condition ~4e3 here; (1, n) would need a negative fixed cost; (n, n^2) fits
    assert model.fixed_s == 0.0 and model.per_token2_s > 0
    assert model.prefill_s(1050) == pytest.approx(truth.prefill_s(1050), rel=1e-3)


def test_only_the_last_window_of_observations_counts():
    slow = [(n, 1.0 + 1e-3 * n) for n in (100, 200, 300)]
    fast = [(n, 0.01 + 1e-4 * n) for n in (100, 200, 300)]
    fit = _fit_of(slow + fast, window=3)
    assert len(fit) == 3
    model = fit.model(PRIOR)
    assert (model.fixed_s, model.per_token_s) == (pytest.approx(0.01), pytest.approx(1e-4))


def test_an_impossible_observation_is_refused():
    fit = OnlinePrefillFit()
    for num_tokens, seconds in ((0, 0.1), (10, -0.1), (10, float("inf"))):
        with pytest.raises(ValueError, match="an observation needs"):
            fit.observe(num_tokens, seconds)
    assert len(fit) == 0
