"""Arrival processes (checked statistically on large n with fixed seeds), length distributions
and their composition, and the independence of what one seed draws for different purposes."""

import math

import numpy as np
import pytest

from loadgen import workload as wl
from loadgen.harness import WorkloadConfig
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


def test_constant_arrivals_are_one_gap_apart_from_the_start_like_vllm():
    assert wl.constant(2.0, 4) == [0.5, 1.0, 1.5, 2.0]  # vLLM --burstiness inf: the last at n / rate
    assert wl.constant(math.inf, 3) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_a_30_request_schedule_realises_exactly_the_requested_mean_rate(seed):
    """vLLM rescales the drawn gaps so n / last arrival is the requested rate; unscaled, 30 exponential
    gaps miss it by ~18% (1/sqrt(30)) typically."""
    poisson = wl.poisson(2.0, 30, seed=seed)
    assert 30 / poisson[-1] == pytest.approx(2.0, rel=1e-12)
    assert poisson == sorted(poisson) and poisson[0] > 0
    bursty = wl.gamma(0.5, 3.0, 30, seed=seed)
    assert 30 / bursty[-1] == pytest.approx(0.5, rel=1e-12)
    assert wl.gamma(math.inf, 1.0, 3) == [0.0, 0.0, 0.0] and wl.poisson(1.0, 0) == []


def test_shared_prefix_group_is_independent_of_the_suffix_length():
    """Groups and lengths come from one --seed; drawn from the same stream, group k got the k-th
    quarter of lengths (group means 62, 87, 112, 138 for this config)."""
    specs = WorkloadConfig(kind="shared-prefix", arrival="poisson", rate_rps=10.0, num_requests=4000,
                           prompt_mean=100, output_mean=10, range_ratio=0.5, num_groups=4, prefix_tokens=32,
                           seed=0).build()
    suffix = np.array([s.prompt_tokens - s.prefix_tokens for s in specs])
    group = np.array([s.prefix_group for s in specs])
    quartile = np.digitize(suffix, np.quantile(suffix, [0.25, 0.5, 0.75]))
    table = np.array([[np.sum((group == g) & (quartile == q)) for q in range(4)] for g in range(4)])
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    chi2 = float(((table - expected) ** 2 / expected).sum())
    assert chi2 < 27.88  # chi-square, 9 degrees of freedom: independence rejected at p = 0.001 above this
    assert all(abs(suffix[group == g].mean() - 100) < 3 for g in range(4))  # 3 s.e. of a group's mean


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
