"""The measured spread of served latencies: summarised by the profiler (plain values), carried by the
profile, drawn by the simulator (hand schedules with planner_testkit's round-number model: prefill
step 0.1 + 0.001*tokens + 1e-6*units, decode step 0.01 + 0.005*batch + 1e-4*context, transfer 5 ms +
10 ms per 10-token block)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from planner_testkit import ROUND_MODEL, round_settings, spec

from planner.profile import ProfileError, load_profile, save_profile
from planner.profiler.spread import MIN_SAMPLES, deviations_from_median, quantile_points, spread_of
from planner.serving_costs import ServingCosts
from planner.simulator import Topology, simulate
from planner.simulator.spread import MIN_STEP_SHARE, ServiceSpread, jittered

EXACT = dict(abs=1e-12)


def test_quantile_points_sit_at_the_middle_of_equal_shares():
    values = list(range(11))                       # order statistics 0..10
    assert quantile_points(values, 4) == pytest.approx((1.25, 3.75, 6.25, 8.75), **EXACT)
    assert quantile_points([5.0], 3) == (5.0, 5.0, 5.0)
    assert quantile_points([3, 1, 2], 1) == (2.0,)  # unsorted input: the median
    with pytest.raises(ValueError):
        quantile_points([], 3)


def test_deviations_are_taken_within_each_group_so_the_model_miss_between_groups_is_not_spread():
    # two prompt lengths whose medians differ by 40 ms (the engine model's miss), each +-1 ms around it
    groups = [[0.010, 0.011, 0.009], [0.050, 0.049, 0.051, 0.050]]
    assert sorted(deviations_from_median(groups)) == pytest.approx([-0.001, -0.001, 0, 0, 0, 0.001, 0.001], **EXACT)


def test_too_few_samples_record_no_spread():
    assert spread_of([[0.1] * (MIN_SAMPLES - 1)]) == ()
    assert spread_of([[0.1] * MIN_SAMPLES]) == (0.0,) * 20


def test_the_profile_carries_the_spread_and_refuses_an_unordered_one(tmp_path):
    from planner.profiles.example import build_example_profile

    costs = ServingCosts(first_token_s=0.004, first_token_spread_s=[-0.001, 0.0, 0.009],
                         decode_step_spread_s=(-0.0005, 0.0, 0.002))
    assert costs.first_token_spread_s == (-0.001, 0.0, 0.009)   # a JSON list becomes a tuple
    profile = dataclasses.replace(build_example_profile(), serving=costs)
    save_profile(profile, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").serving == costs
    with pytest.raises(ProfileError, match="decode_step_spread_s must be ascending"):
        ServingCosts(decode_step_spread_s=(0.002, 0.0))
    with pytest.raises(ProfileError, match="first_token_spread_s must hold finite numbers"):
        ServingCosts(first_token_spread_s=(0.0, float("nan")))


def test_a_constant_spread_shifts_every_decode_step_and_first_token_by_hand():
    base = ServingCosts(first_token_s=0.004)
    shifted = ServingCosts(first_token_s=0.004, first_token_spread_s=(0.005,) * 4, decode_step_spread_s=(0.002,) * 4)
    requests = [spec(0.0, 50, 3)]
    plain = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=base), ROUND_MODEL)
    spread = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=shifted), ROUND_MODEL)
    # the prefill step emits no decode token: the first token is produced at the same instant ...
    assert spread.timeline["first_token_s"].tolist() == plain.timeline["first_token_s"].tolist()
    # ... and reaches the client 5 ms later; each of the two decode steps takes 2 ms longer
    assert spread.ttft_s.tolist() == pytest.approx((plain.ttft_s + 0.005).tolist(), **EXACT)
    assert spread.timeline["finish_s"].tolist() == pytest.approx((plain.timeline["finish_s"] + 0.004).tolist(), **EXACT)
    assert spread.tpot_s.tolist() == pytest.approx((plain.tpot_s + 0.002).tolist(), **EXACT)


def test_a_colocated_step_takes_the_draw_only_when_it_decodes():
    shifted = ServingCosts(decode_step_spread_s=(0.003,) * 2)
    one_token = [spec(0.0, 50, 1)]   # its only step is a prefill: no decode token, no draw
    plain = simulate(one_token, Topology.colocated(1), round_settings(), ROUND_MODEL)
    spread = simulate(one_token, Topology.colocated(1), round_settings(serving=shifted), ROUND_MODEL)
    assert spread.timeline["finish_s"].tolist() == plain.timeline["finish_s"].tolist()
    three = [spec(0.0, 50, 3)]       # then two decode steps
    plain = simulate(three, Topology.colocated(1), round_settings(), ROUND_MODEL)
    spread = simulate(three, Topology.colocated(1), round_settings(serving=shifted), ROUND_MODEL)
    assert spread.timeline["finish_s"].tolist() == pytest.approx((plain.timeline["finish_s"] + 0.006).tolist(), **EXACT)


def test_draws_are_seeded_and_widen_the_tail_more_than_the_middle():
    requests = [spec(i * 0.3, 40, 8) for i in range(200)]   # light load: latencies are service times
    costs = ServingCosts(first_token_s=0.004, first_token_spread_s=(-0.002,) * 17 + (0.02, 0.04, 0.08),
                         decode_step_spread_s=(-0.001,) * 18 + (0.01, 0.03))
    settings = round_settings(serving=costs)
    plain = simulate(requests, Topology.disaggregated(1, 1), round_settings(serving=ServingCosts(first_token_s=0.004)),
                     ROUND_MODEL)
    first = simulate(requests, Topology.disaggregated(1, 1), settings, ROUND_MODEL)
    again = simulate(requests, Topology.disaggregated(1, 1), settings, ROUND_MODEL)
    other = simulate(requests, Topology.disaggregated(1, 1), dataclasses.replace(settings, spread_seed=1), ROUND_MODEL)
    assert first.ttft_s.tolist() == again.ttft_s.tolist()               # deterministic
    assert first.ttft_s.tolist() != other.ttft_s.tolist()               # the seed moves the draws
    ttft_p50 = np.percentile(first.ttft_s, 50) - np.percentile(plain.ttft_s, 50)
    ttft_p90 = np.percentile(first.ttft_s, 95) - np.percentile(plain.ttft_s, 95)
    assert ttft_p50 == pytest.approx(-0.002, abs=1e-9)                  # the middle moves by the middle point
    assert ttft_p90 > 0.015                                             # the tail by the tail's points
    tpot_mean = np.mean(first.tpot_s) - np.mean(plain.tpot_s)
    assert tpot_mean == pytest.approx(np.mean(costs.decode_step_spread_s), abs=0.002)   # a mean over ~1,400 draws


def test_a_draw_never_shortens_a_step_below_its_floor_and_owes_the_rest_to_the_next():
    assert jittered(0.010, -0.004) == pytest.approx((0.006, 0.0), **EXACT)
    floor = MIN_STEP_SHARE * 0.010
    assert jittered(0.010, -0.050) == pytest.approx((floor, 0.010 - 0.050 - floor), **EXACT)   # 42.5 ms owed
    assert jittered(0.010, 0.002, owed_s=-0.005) == pytest.approx((0.007, 0.0), **EXACT)  # paid from this one
    assert jittered(0.010, 0.020, owed_s=0.003) == pytest.approx((0.030, 0.0), **EXACT)   # nothing is owed above 0
    assert jittered(0.010, -0.050, carry=False) == pytest.approx((floor, 0.0), **EXACT)      # cut: dropped
    assert ServiceSpread(ServingCosts()).step_extra_s() == 0.0
    assert ServiceSpread(ServingCosts()).first_token_extra_s(3).tolist() == [0.0, 0.0, 0.0]



def test_a_short_step_owes_what_its_draw_could_not_take_to_the_next_when_carried():
    """One request decoding alone (steps of about 20 ms: floor 5 ms), drawn -30 then +30 ms: the
    first step stops at its floor, 15 ms short of its draw; carried, the second pays them, so the
    two keep the draws' sum (0); cut, they are lost and the pair runs 15 ms long."""
    from planner.simulator.instances import DecodeInstance
    from planner.simulator.state import ItlLog, SimRequest

    def two_steps(step_spread: str) -> tuple[float, float, float]:
        decode = DecodeInstance(0, round_settings(step_spread=step_spread), ROUND_MODEL, ItlLog())
        request = SimRequest(0, 0.0, 50, 10)
        assert decode.receive(request, 0.0) == [request]
        decode.transfer_done(request)
        first_end = decode.start_step(1.0, extra_s=-0.030)
        decode.finish_step(first_end)
        second_end = decode.start_step(first_end, extra_s=0.030)
        return first_end - 1.0, second_end - first_end, ROUND_MODEL.decode_step_s(1, 51) + ROUND_MODEL.decode_step_s(1, 52)

    first, second, modelled = two_steps("carried")
    assert first == pytest.approx(MIN_STEP_SHARE * ROUND_MODEL.decode_step_s(1, 51), **EXACT)
    assert first + second == pytest.approx(modelled, **EXACT)
    first, second, modelled = two_steps("cut")
    assert first + second == pytest.approx(modelled + 0.030 - (1 - MIN_STEP_SHARE) * ROUND_MODEL.decode_step_s(1, 51),
                                           **EXACT)
