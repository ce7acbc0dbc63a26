"""The machine's speed as it moved (`SimSettings.decode_speed`, `planner.simulator.speed.DecodeSpeed`):
a decode-side instance's step takes the factor of the window it starts in, on a hand schedule."""

from __future__ import annotations

import pytest

from planner.simulator import DecodeSpeed, SimulationError, Topology, simulate
from planner_testkit import ROUND_MODEL, round_settings, spec


def test_a_step_takes_its_instances_factor_of_the_window_it_starts_in():
    speed = DecodeSpeed.of([[1.0, 2.0], [3.0]], window_s=0.5)
    assert [speed.factor(0, t) for t in (0.0, 0.49, 0.5, 0.99, 1.0, -0.1)] == [1.0, 1.0, 2.0, 2.0, 1.0, 1.0]
    assert [speed.factor(1, t) for t in (0.0, 0.6)] == [3.0, 1.0]   # past its series' end: as profiled
    assert speed.factor(2, 0.6) == 2.0   # instance 2 takes series 0 (2 mod 2)
    assert DecodeSpeed().factor(0, 0.3) == 1.0
    with pytest.raises(SimulationError, match="window_s must be > 0"):
        DecodeSpeed.of([[1.0]], window_s=0.0)
    with pytest.raises(SimulationError, match=r"series\[1\] holds a factor <= 0"):
        DecodeSpeed.of([[1.0], [1.0, 0.0]])


def timeline(speed: DecodeSpeed | None) -> dict[str, float]:
    """One 50-token prompt at 0 with 4 tokens out: its prefill step 0.1 + 0.05 + 0.0025 = 0.1525 s,
    its pull (5 blocks of 1,000 bytes) 0.005 + 0.05 = 0.055 s, then three decode steps of one
    sequence at contexts 51, 52, 53: 0.01 + 0.005 + 1e-4 x context = 20.1, 20.2, 20.3 ms."""
    result = simulate([spec(0.0, 50, 4)], Topology.disaggregated(1, 1), round_settings(decode_speed=speed), ROUND_MODEL)
    return {name: float(values[0]) for name, values in result.timeline.items()}


def test_the_decode_steps_follow_the_speed_and_the_prompt_does_not():
    as_profiled = timeline(None)
    assert as_profiled["transfer_end_s"] == pytest.approx(0.2075)
    assert as_profiled["finish_s"] == pytest.approx(0.2075 + 0.0201 + 0.0202 + 0.0203)
    assert timeline(DecodeSpeed.of([[1.0] * 5])) == pytest.approx(as_profiled)
    twice = timeline(DecodeSpeed.of([[2.0] * 5]))
    assert twice["first_token_s"] == pytest.approx(0.1525)   # a prompt is not a decode step
    assert twice["first_decode_token_s"] == pytest.approx(0.2075 + 2 * 0.0201)
    assert twice["finish_s"] == pytest.approx(0.2075 + 2 * (0.0201 + 0.0202 + 0.0203))
    # windows of 0.24 s: the first two steps start at 0.2075 and 0.2276, in window 0 (1x); the
    # third at 0.2478, in window 1 (3x)
    switched = timeline(DecodeSpeed.of([[1.0, 3.0]], window_s=0.24))
    assert switched["finish_s"] == pytest.approx(0.2075 + 0.0201 + 0.0202 + 3 * 0.0203)


def test_a_series_drawn_from_the_profiles_keeps_its_blocks_and_is_seeded():
    from planner.simulator.speed import drawn_series

    profile = [[1.0, 1.0, 2.0, 2.0], [None, 4.0, 4.0, 4.0]]   # ms per window, two cores
    drawn = drawn_series(profile, 2.0, 7, seed=3, block_windows=2)
    assert len(drawn) == 7 and drawn == drawn_series(profile, 2.0, 7, seed=3, block_windows=2)
    blocks = {(0.5, 0.5), (0.5, 1.0), (1.0, 1.0), (1.0, 2.0), (2.0, 2.0)}   # over the mean; None as 1.0
    assert all(pair in blocks for pair in zip(drawn[0:6:2], drawn[1:6:2]))   # whole blocks, end to end
    assert drawn[6] in {0.5, 1.0, 2.0}
    seeds = {drawn_series(profile, 2.0, 8, seed=s, block_windows=2) for s in range(20)}
    assert len(seeds) > 1   # the seed picks the blocks
    assert drawn_series(profile, 2.0, 3, seed=0, block_windows=9)   # blocks shorter than asked: the longest series
    assert drawn_series([], 2.0, 3, seed=0) == () and drawn_series(profile, 2.0, 0, seed=0) == ()
    with pytest.raises(SimulationError, match="mean interpreter ms > 0"):
        drawn_series(profile, 0.0, 3, seed=0)
    speed = DecodeSpeed.drawn(profile, 2.0, 0.5, instances=2, length_s=2.2, seed=3)
    assert [len(s) for s in speed.series] == [5, 5] and speed.window_s == 0.5
    assert DecodeSpeed.drawn([], 2.0, 1.0, instances=1, length_s=5.0, seed=0).series == ()


def test_a_speed_with_an_elasticity_moves_the_steps_by_that_power_of_its_factors():
    speed = DecodeSpeed.of([[1.44, 0.64]], window_s=2.0)
    half = speed.with_elasticity(0.5)
    assert half.series[0] == pytest.approx((1.2, 0.8)) and half.window_s == 2.0
    assert speed.with_elasticity(1.0) is speed
    assert speed.with_elasticity(0.0).series[0] == (1.0, 1.0)   # steps that do not follow the loop at all
