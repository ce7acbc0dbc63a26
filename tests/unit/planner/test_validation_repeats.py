"""The same validation run several times (planner/validation_repeats.py): the runs' spread, the
simulator's error against their mean and against each, with plain values."""

from __future__ import annotations

import pytest
from rich.console import Console

from planner.validation import Comparison, rates_to_knee
from planner.validation_repeats import (plot_repeats, repeats, repeats_markdown, repeats_table, repeats_to_json,
                                        spread)


def summary(ttft50: float, attainment: float, tpot50: float = 10.0) -> dict[str, float]:
    return {"median_ttft_ms": ttft50, "p90_ttft_ms": 2 * ttft50, "median_tpot_ms": tpot50, "p90_tpot_ms": 2 * tpot50,
            "slo_attainment": attainment}


def run(attainments: list[float], ttfts: list[float], simulated_attainments: list[float],
        simulated_ttfts: list[float], rates=(2.0, 4.0, 6.0), model: str = "p") -> list[Comparison]:
    return [Comparison(rate, model, summary(real, att), summary(sim, sim_att))
            for rate, att, real, sim_att, sim in zip(rates, attainments, ttfts, simulated_attainments, simulated_ttfts)]


def test_the_knee_is_the_rates_before_the_first_miss_and_at_least_the_lowest():
    assert rates_to_knee([1.0, 0.95, 0.5, 0.95]) == 2
    assert rates_to_knee([0.5, 1.0]) == 1
    assert rates_to_knee([1.0, 1.0]) == 2


def test_spread_is_the_mean_distance_from_the_mean_over_the_mean():
    assert spread([8.0, 12.0]) == pytest.approx(0.2)
    assert spread([9.0, 10.0, 11.0]) == pytest.approx((1 + 0 + 1) / 3 / 10)
    assert spread([5.0]) is None and spread([0.0, 0.0]) is None


def test_goodput_of_each_run_against_the_simulated_mean():
    # run 1 crosses 90% halfway between 4 and 6 (1.0 -> 0.8): 5.0; run 2 between 2 and 4: 3.0;
    # the simulator's crossing on both: 4.0 + 2 x (1.0 - 0.9) / (1.0 - 0.5) = 4.4
    first = run([1.0, 1.0, 0.8], [100, 110, 300], [1.0, 1.0, 0.5], [100, 110, 300])
    second = run([1.0, 0.8, 0.5], [120, 130, 400], [1.0, 1.0, 0.5], [100, 110, 300])
    r = repeats([first, second], "short-long", "1P+1D", "p")
    assert [g for g, _ in r.measured_goodputs] == pytest.approx([5.0, 3.0])
    assert r.simulated_mean_rps == pytest.approx(4.4) and r.measured_mean_rps == pytest.approx(4.0)
    assert r.goodput_spread == pytest.approx(0.25)
    assert r.goodput_error == pytest.approx(0.1)
    assert r.one_run_goodput_error == pytest.approx((abs(4.4 - 5) / 5 + abs(4.4 - 3) / 3) / 2)
    assert r.simulated_within_runs is True


def test_latencies_against_the_runs_mean_up_to_the_knee_of_their_mean_attainment():
    # mean attainment 1.0, 0.9, 0.65: the knee takes rates 2 and 4
    first = run([1.0, 1.0, 0.8], [100, 100, 300], [1.0, 1.0, 0.5], [110, 90, 999])
    second = run([1.0, 0.8, 0.5], [100, 300, 400], [1.0, 1.0, 0.5], [110, 90, 999])
    r = repeats([first, second], "s", "1P+1D", "p")
    assert r.rates_to_knee == (2.0, 4.0)
    # rate 2: mean 100, spread 0, sim 110 (+10%); rate 4: mean 200, spread 0.5, sim 90 (-55%)
    assert r.spread_to_knee["median_ttft_ms"] == pytest.approx(0.25)
    assert r.error_to_knee["median_ttft_ms"] == pytest.approx((0.1 + 0.55) / 2)
    assert r.bias_to_knee["median_ttft_ms"] == pytest.approx((0.1 - 0.55) / 2)
    assert r.spread_to_knee["median_tpot_ms"] == 0.0 and r.error_to_knee["median_tpot_ms"] == 0.0


def test_runs_on_different_grids_keep_goodput_but_not_the_percentiles():
    first = run([1.0, 1.0, 0.8], [100, 100, 300], [1.0, 1.0, 0.5], [100, 100, 300])
    second = run([1.0, 1.0, 0.8], [100, 100, 300], [1.0, 1.0, 0.5], [100, 100, 300], rates=(3.0, 5.0, 9.0))
    r = repeats([first, second], "s", "1P+1D", "p")
    assert r.grid_rps == () and r.error_to_knee["median_ttft_ms"] is None
    assert [g for g, _ in r.measured_goodputs] == pytest.approx([5.0, 7.0])


def test_each_runs_own_refinement_of_its_knee_counts_for_its_goodput_and_the_shared_rates_for_percentiles():
    # the grid 2, 4, 6; the first run refined at 5 (passed), the second at 3 (missed)
    first = run([1.0, 1.0, 0.95, 0.8], [100, 100, 150, 300], [1.0, 1.0, 1.0, 0.5], [100, 100, 100, 300],
                rates=(2.0, 4.0, 5.0, 6.0))
    second = run([1.0, 0.5, 1.0, 0.3], [100, 120, 200, 400], [1.0, 1.0, 1.0, 0.5], [100, 100, 100, 300],
                 rates=(2.0, 3.0, 4.0, 6.0))
    r = repeats([first, second], "s", "1P+1D", "p")
    assert r.grid_rps == (2.0, 4.0, 6.0)
    # 5 + (0.95 - 0.9) / (0.95 - 0.8) = 5.33; 2 + (1.0 - 0.9) / (1.0 - 0.5) = 2.2
    assert [g for g, _ in r.measured_goodputs] == pytest.approx([5 + 1 / 3, 2.2])
    # mean attainment at 2, 4, 6: 1.0, 1.0, 0.55: the knee takes 2 and 4; at 4 the runs read 100 and 200
    assert r.rates_to_knee == (2.0, 4.0)
    assert r.spread_to_knee["median_ttft_ms"] == pytest.approx((0 + 1 / 3) / 2)


def test_a_bound_leaves_the_goodput_figures_unknown_and_says_which_side():
    never_misses = run([1.0, 1.0, 1.0], [100, 100, 100], [1.0, 1.0, 0.5], [100, 100, 300])
    misses = run([1.0, 1.0, 0.8], [100, 100, 300], [1.0, 1.0, 0.5], [100, 100, 300])
    r = repeats([never_misses, misses], "s", "1P+1D", "p")
    assert not r.bracketed and r.goodput_spread is None and r.goodput_error is None
    # the simulator's bound leaves the runs' own spread known
    simulated_never_misses = run([1.0, 1.0, 0.8], [100, 100, 300], [1.0, 1.0, 1.0], [100, 100, 100])
    both = repeats([misses, simulated_never_misses], "s", "1P+1D", "p")
    assert both.goodput_spread == 0.0 and both.goodput_error is None
    assert "| 5.00 / 5.00 | 0% | 4.40 / >= 6 |" in repeats_markdown([both])
    assert r.simulated_within_runs is None and r.one_run_goodput_error is None
    console = Console(record=True, width=400)
    console.print(repeats_table([r]))
    assert ">= 6 / 5.00" in console.export_text()


def test_a_run_without_the_model_is_an_error():
    first = run([1.0], [100], [1.0], [100], rates=(2.0,))
    with pytest.raises(ValueError, match="'other'"):
        repeats([first, first], "s", "1P+1D", "other")


def test_table_markdown_json_and_plot(tmp_path):
    first = run([1.0, 1.0, 0.8], [100, 110, 300], [1.0, 1.0, 0.5], [100, 110, 300])
    second = run([1.0, 0.8, 0.5], [120, 130, 400], [1.0, 1.0, 0.5], [100, 110, 300])
    rows = [repeats([first, second], "short-long", "1P+1D", "p"), repeats([second, first], "trace", "1P+1D", "p")]
    text = repeats_markdown(rows)
    assert "| short-long | 1P+1D | p | 2 | 5.00 / 3.00 | 25% | 4.40 | +10% |" in text
    data = repeats_to_json(rows)
    assert data[0]["goodput_rps"]["measured"] == [[pytest.approx(5.0), True], [pytest.approx(3.0), True]]
    assert data[0]["simulated_within_runs"] is True and data[1]["rates_to_knee"] == [2.0, 4.0]
    assert plot_repeats(rows, tmp_path / "r.png", "t").stat().st_size > 10_000
