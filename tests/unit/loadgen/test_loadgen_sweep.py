"""The goodput search on known attainment curves."""

import pytest

from loadgen.sweep import (GRID_STEP, SearchConfig, find_goodput, goodput_on_grid, knee_midpoint, next_bracketing_rate,
                           stopped_search)


def step(threshold_rps):
    return lambda rate: 1.0 if rate <= threshold_rps else 0.5


def test_brackets_by_doubling_then_bisects_to_tolerance():
    found = find_goodput(step(3.7), SearchConfig(start_rps=1.0, rel_tol=0.05))
    assert [p.rate_rps for p in found.probes] == [1.0, 2.0, 4.0, 3.0, 3.5, 3.75, 3.625]
    assert [p.passed for p in found.probes] == [True, True, False, True, True, False, True]
    assert found.goodput_rps == 3.625 and found.bracketed


def test_brackets_by_halving_when_the_start_rate_fails():
    found = find_goodput(step(0.3), SearchConfig(start_rps=2.0, rel_tol=0.1))
    assert [p.rate_rps for p in found.probes][:4] == [2.0, 1.0, 0.5, 0.25]
    assert found.goodput_rps <= 0.3 and (0.3 - found.goodput_rps) <= 0.1 * 0.3 + 1e-12
    assert found.bracketed


def test_smooth_curve_finds_where_attainment_crosses_the_target():
    curve = lambda rate: max(0.0, 1.0 - 0.05 * rate)  # noqa: E731  crosses 0.9 at rate 2.0
    found = find_goodput(curve, SearchConfig(start_rps=0.5, rel_tol=0.01, max_probes=20))
    assert found.goodput_rps == pytest.approx(2.0, rel=0.01) and found.goodput_rps <= 2.0


def test_nothing_passes_gives_zero_and_everything_passes_gives_the_cap():
    never = find_goodput(lambda rate: 0.0, SearchConfig(start_rps=1.0, min_rps=0.25))
    assert (never.goodput_rps, never.bracketed) == (0.0, False)
    assert [p.rate_rps for p in never.probes] == [1.0, 0.5, 0.25]
    always = find_goodput(lambda rate: 1.0, SearchConfig(start_rps=1.0, max_rps=5.0))
    assert (always.goodput_rps, always.bracketed) == (5.0, False)
    assert [p.rate_rps for p in always.probes] == [1.0, 2.0, 4.0, 5.0]


def test_probe_budget_is_respected():
    found = find_goodput(step(3.7), SearchConfig(start_rps=1.0, rel_tol=0.001, max_probes=5))
    assert len(found.probes) == 5 and found.goodput_rps == 3.5 and not found.bracketed
    assert found.curve == [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (3.5, 1.0), (4.0, 0.5)]


def test_config_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="min_rps <= start_rps <= max_rps"):
        SearchConfig(start_rps=10.0, max_rps=5.0)


def test_grid_goodput_interpolates_the_first_crossing_of_the_target():
    curve = [(2.0, 0.5), (0.5, 1.0), (1.0, 0.95), (1.5, 0.85), (3.0, 0.95)]  # unsorted; noisy pass at 3.0
    goodput, bracketed = goodput_on_grid(curve, target=0.9)
    assert goodput == pytest.approx(1.25) and bracketed  # halfway from 0.95 @ 1.0 to 0.85 @ 1.5


def test_grid_goodput_outside_the_grid_is_flagged():
    assert goodput_on_grid([(0.5, 0.8), (1.0, 0.2)]) == (0.0, False)
    assert goodput_on_grid([(0.5, 1.0), (1.0, 0.9)]) == (1.0, False)  # exactly the target passes
    with pytest.raises(ValueError, match="empty"):
        goodput_on_grid([])


def test_the_next_rate_halves_the_bracket_the_grid_goodput_interpolates_across():
    grid = [(5.4, 1.0), (10.8, 1.0), (16.2, 0.35), (21.6, 0.07)]
    assert knee_midpoint(grid) == pytest.approx(13.5)
    # measured there and passing: the bracket is now 13.5-16.2
    assert knee_midpoint(grid + [(13.5, 0.95)]) == pytest.approx(14.85)
    # the first crossing decides, as for goodput_on_grid: a pass above a failure is not a bracket
    assert knee_midpoint([(1.0, 1.0), (2.0, 0.5), (3.0, 0.95)]) == pytest.approx(1.5)
    # nothing to refine: no rate fails, the lowest fails, or the bracket is within 5% of its top
    assert knee_midpoint([(1.0, 1.0), (2.0, 0.95)]) is None
    assert knee_midpoint([(1.0, 0.5), (2.0, 0.2)]) is None
    assert knee_midpoint([(10.0, 1.0), (10.4, 0.5)]) is None
    assert knee_midpoint([(10.0, 1.0), (10.4, 0.5)], min_gap=0.01) == pytest.approx(10.2)
    with pytest.raises(ValueError, match="empty"):
        knee_midpoint([])


def test_the_next_rate_steps_past_a_grid_that_does_not_bracket_the_goodput_then_halves_the_bracket():
    # every rate met the target: the goodput lies above the grid, so step above its top
    passing = [(2.0, 1.0), (4.0, 0.97), (6.0, 0.92)]
    assert next_bracketing_rate(passing) == pytest.approx(6.0 * GRID_STEP)
    # that rate missed: now the bracket 6.0-7.8 is halved, as knee_midpoint does
    assert next_bracketing_rate(passing + [(7.8, 0.6)]) == pytest.approx(6.9)
    assert next_bracketing_rate(passing + [(7.8, 0.6)]) == knee_midpoint(passing + [(7.8, 0.6)])
    # the lowest rate already missed: the goodput lies below the grid, so step below it
    assert next_bracketing_rate([(1.3, 0.5), (2.6, 0.1)]) == pytest.approx(1.0)
    assert next_bracketing_rate([(1.0, 1.0), (2.0, 0.9)], step=1.5) == pytest.approx(3.0)  # 90% passes
    # bracketed within min_gap: nothing left to measure
    assert next_bracketing_rate([(10.0, 1.0), (10.4, 0.5)]) is None


def test_a_stopped_search_answers_from_the_probes_it_measured():
    stopped = stopped_search([(1.0, 1.0), (2.0, 0.95), (4.0, 0.5), (3.0, 0.92)], target=0.9)
    assert (stopped.goodput_rps, stopped.bracketed) == (3.0, False)  # passing, and below the failure at 4
    assert [p.passed for p in stopped.probes] == [True, True, False, True]
    assert stopped_search([(1.0, 0.97), (8.0, 0.95), (2.0, 0.3)]).goodput_rps == 1.0  # 8 passed above a failure
    assert stopped_search([(1.0, 0.2)]).goodput_rps == 0.0 and stopped_search([]).goodput_rps == 0.0
