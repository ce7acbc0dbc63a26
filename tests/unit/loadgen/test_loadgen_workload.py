"""Arrival processes (checked statistically on large n with fixed seeds), length distributions
and their composition."""

import math

import numpy as np
import pytest

from loadgen import workload as wl
from loadgen.workload import RequestSpec


def _gap_stats(arrivals_s: list[float]) -> tuple[float, float]:
    gaps = np.diff([0.0, *arrivals_s])
    return 1.0 / gaps.mean(), gaps.std() / gaps.mean()


def test_poisson_has_the_requested_mean_rate_and_cv_one():
    rate, cv = _gap_stats(wl.poisson(4.0, 20_000, seed=7))
    assert rate == pytest.approx(4.0, rel=0.03)
    assert cv == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("target_cv", [0.5, 2.0])
def test_gamma_has_the_requested_mean_rate_and_burstiness(target_cv):
    rate, cv = _gap_stats(wl.gamma(2.5, target_cv, 20_000, seed=3))
    assert rate == pytest.approx(2.5, rel=0.04)
    assert cv == pytest.approx(target_cv, rel=0.05)


def test_arrivals_are_reproducible_per_seed_and_differ_across_seeds():
    assert wl.poisson(1.0, 50, seed=1) == wl.poisson(1.0, 50, seed=1)
    assert wl.poisson(1.0, 50, seed=1) != wl.poisson(1.0, 50, seed=2)
    arrivals = wl.gamma(1.0, 3.0, 500, seed=5)
    assert arrivals == sorted(arrivals) and arrivals[0] > 0


def test_constant_arrivals_are_evenly_spaced_from_zero():
    assert wl.constant(2.0, 4) == [0.0, 0.5, 1.0, 1.5]
    assert wl.constant(math.inf, 3) == [0.0, 0.0, 0.0]


def test_bad_rates_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match="rate_rps must be > 0"):
        wl.poisson(0.0, 10)
    with pytest.raises(ValueError, match="cv"):
        wl.gamma(1.0, 0.0, 10)


def test_uniform_lengths_stay_within_the_vllm_random_range():
    lengths = wl.uniform_lengths(5_000, prompt_mean=100, output_mean=20, range_ratio=0.5, seed=0)
    prompts = [p for p, _ in lengths]
    outputs = [o for _, o in lengths]
    assert (min(prompts), max(prompts)) == (50, 150)
    assert (min(outputs), max(outputs)) == (10, 30)
    assert np.mean(prompts) == pytest.approx(100, rel=0.02)
    assert wl.uniform_lengths(3, 64, 8) == [(64, 8), (64, 8), (64, 8)]


def test_combine_zips_arrivals_and_lengths_sorted_by_arrival():
    specs = wl.combine([0.3, 0.1], [(10, 2), (20, 4)])
    assert specs == [RequestSpec(0.1, 20, 4), RequestSpec(0.3, 10, 2)]
    with pytest.raises(ValueError, match="same n"):
        wl.combine([0.0], [(1, 1), (2, 2)])


def test_shared_prefix_prepends_one_of_k_system_prompts():
    specs = wl.shared_prefix(wl.constant(10.0, 400), num_groups=3, prefix_tokens=64,
                             suffix_lengths=wl.fixed_lengths(400, 16, 8), seed=1)
    assert {s.prefix_group for s in specs} == {0, 1, 2}
    assert all(s.prompt_tokens == 80 and s.prefix_tokens == 64 and s.output_tokens == 8 for s in specs)


def test_retime_to_a_rate_keeps_relative_gaps():
    specs = wl.combine([1.0, 2.0, 5.0], wl.fixed_lengths(3, 4, 2))
    retimed = wl.retime(specs, rate_rps=1.5)  # 3 requests over 2 s
    assert [s.arrival_s for s in retimed] == [0.0, 0.5, 2.0]
    assert wl.retime(specs, arrivals_s=[0.2, 0.1, 0.0])[0] == RequestSpec(0.0, 4, 2)


def test_request_spec_validates_with_reasons():
    with pytest.raises(ValueError, match="output_tokens >= 1"):
        RequestSpec(0.0, 10, 0)
    with pytest.raises(ValueError, match="prefix_tokens"):
        RequestSpec(0.0, 10, 1, prefix_group=0, prefix_tokens=11)
    with pytest.raises(ValueError, match="together"):
        RequestSpec(0.0, 10, 1, prefix_group=0)
