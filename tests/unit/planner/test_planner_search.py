"""The goodput search on a synthetic model with a known optimum.

Model: N prefill + M decode serve up to min(3N, 2M) req/s (prefill does 3 req/s per device,
decode 2); K colocated instances serve 1.1K req/s. Below capacity every request meets the SLOs,
above it half do. Goodput per device is best at N:M = 2:3 (1.2 req/s per device). Hybrid pools
serve 0.5 req/s more per decode worker under a local prefill cap of 256 tokens (0.2 otherwise):
best at 2P+3H/256, 1.5 req/s per device. Colocated instances whose engines step 512 tokens serve
1.3K req/s (the chunk no longer stalls their decodes), every other budget 1.1K.
"""

from __future__ import annotations

import pytest

from planner.rate_search import SearchSettings, max_rate
from planner.search import enumerate_splits, enumerate_topologies, fewest_devices, search_splits
from planner.simulator import Topology

NOT_HYBRID = ("disaggregated", "aggregated")


def capacity_rps(topology: Topology) -> float:
    if topology.is_colocated:
        return (1.3 if topology.token_budget == 512 else 1.1) * topology.num_colocated
    split = min(3.0 * topology.num_prefill, 2.0 * topology.num_decode)
    if topology.kind == "hybrid":
        return split + (0.5 if topology.local_prefill_max_tokens == 256 else 0.2) * topology.num_decode
    return split


def synthetic_attainment(topology: Topology, rate_rps: float) -> float:
    return 1.0 if rate_rps <= capacity_rps(topology) else 0.5


def test_enumerate_splits_covers_every_n_plus_m_within_the_budget():
    labels = [t.label for t in enumerate_splits(4)]
    assert labels == ["1P+1D", "1P+2D", "2P+1D", "1P+3D", "2P+2D", "3P+1D"]


def test_enumerate_topologies_lists_each_kind_and_each_hybrid_cap():
    labels = [t.label for t in enumerate_topologies(3, local_prefill_caps=(0, 256), token_budgets=(0,))]
    assert labels == ["1P+1D", "1P+2D", "2P+1D", "1P+1H", "1P+1H/256", "1P+2H", "1P+2H/256", "2P+1H", "2P+1H/256",
                      "1C", "2C", "3C"]
    assert [t.label for t in enumerate_topologies(3, kinds=("aggregated",), token_budgets=(0,))] == ["1C", "2C", "3C"]
    with pytest.raises(ValueError, match="topology kinds must be some of"):
        enumerate_topologies(3, kinds=("colocated",))


def test_enumerate_topologies_tries_each_token_budget_where_one_engine_runs_both_phases():
    labels = [t.label for t in enumerate_topologies(2, local_prefill_caps=(0, 256), token_budgets=(0, 512))]
    assert labels == ["1P+1D", "1P+1H", "1P+1H@512", "1P+1H/256", "1P+1H/256@512", "1C", "1C@512", "2C", "2C@512"]
    assert Topology.from_label("1P+1H/256@512") == Topology.hybrid(1, 1, 256, token_budget=512)
    assert Topology.from_label("2C@512") == Topology.aggregated(2, token_budget=512)
    with pytest.raises(ValueError, match="token budgets must be >= 0"):
        enumerate_topologies(2, token_budgets=())


def test_enumerate_topologies_offers_aggregated_workers_as_wide_as_the_profile_measured():
    labels = [t.label for t in enumerate_topologies(4, kinds=("aggregated",), token_budgets=(0, 512), widths=(1, 2))]
    assert labels == ["1C", "1C@512", "2C", "2C@512", "3C", "3C@512", "4C", "4C@512",
                      "1Cx2", "1Cx2@512", "2Cx2", "2Cx2@512"]
    assert all(t.devices <= 4 for t in enumerate_topologies(4, widths=(1, 2, 4)))
    assert [t.label for t in enumerate_topologies(3, kinds=("aggregated",), token_budgets=(0,), widths=(2,))] == \
        ["1C", "2C", "3C", "1Cx2"]
    with pytest.raises(ValueError, match="devices per instance must be >= 1"):
        enumerate_topologies(2, widths=(0,))


def test_search_picks_one_wide_worker_when_it_serves_more_than_two_narrow_ones():
    def attainment(topology: Topology, rate_rps: float) -> float:
        wide = 2.5 if topology.devices_per_instance == 2 else capacity_rps(topology)
        return 1.0 if rate_rps <= wide else 0.5

    result = search_splits(attainment, 2, SearchSettings(rel_tol=0.01), kinds=("aggregated",), token_budgets=(0,),
                           objective="total", widths=(1, 2))
    assert result.best.topology == Topology.aggregated(1, devices_per_instance=2)
    assert result.best.goodput_per_device == pytest.approx(1.25, rel=0.01)


def test_search_picks_the_token_budget_that_serves_most():
    result = search_splits(synthetic_attainment, 2, SearchSettings(rel_tol=0.01), kinds=("aggregated",),
                           token_budgets=(0, 256, 512), objective="total")
    assert result.best.topology == Topology.aggregated(2, token_budget=512)
    assert result.best.max_rate_rps == pytest.approx(2.6, rel=0.01)
    unchanged = search_splits(synthetic_attainment, 2, SearchSettings(rel_tol=0.01), kinds=("aggregated",),
                              token_budgets=(0, 256), objective="total")
    assert unchanged.best.topology == Topology.aggregated(2)   # a tie keeps the engine's own budget


def test_search_returns_each_kinds_goodput_and_picks_the_highest_per_device():
    result = search_splits(synthetic_attainment, 5, SearchSettings(rel_tol=0.01), token_budgets=(0,))
    assert result.best.topology == Topology.hybrid(2, 3, 256)
    best = result.best_by_kind()
    assert list(best) == ["disaggregated", "hybrid", "aggregated"]
    assert best["hybrid"] is result.best
    assert best["disaggregated"].topology == Topology.disaggregated(2, 3)
    assert {kind: r.goodput_per_device for kind, r in best.items()} == pytest.approx(
        {"disaggregated": 1.2, "hybrid": 1.5, "aggregated": 1.1}, rel=0.01)
    assert len(result.hybrid) == 3 * len(result.disaggregated) == 30


def test_search_finds_the_known_optimal_split_and_its_rate():
    seen: list[str] = []
    result = search_splits(synthetic_attainment, 5, SearchSettings(rel_tol=0.01), progress=seen.append,
                           kinds=NOT_HYBRID, token_budgets=(0,))
    assert result.best.topology == Topology.disaggregated(2, 3)
    assert 6.0 / 1.01 <= result.best.max_rate_rps <= 6.0
    assert result.best.goodput_per_device == pytest.approx(1.2, rel=0.01)
    assert result.best.attainment == 1.0
    assert result.best_colocated.goodput_per_device == pytest.approx(1.1, rel=0.01)
    assert len(result.disaggregated) == 10 and len(result.colocated) == 5
    assert seen[0] == "1P+1D" and seen[-1] == "5C" and len(seen) == 15


def test_every_rate_found_is_within_tolerance_below_capacity():
    result = search_splits(synthetic_attainment, 4, SearchSettings(rel_tol=0.02))
    for r in result.results:
        cap = capacity_rps(r.topology)
        assert cap / 1.02 <= r.max_rate_rps <= cap, r.topology.label


def test_max_rate_is_zero_when_even_the_lowest_rate_misses():
    rate, value, samples = max_rate(lambda r: 0.2, SearchSettings(min_rate_rps=0.1, rate_hint_rps=1.0))
    assert rate == 0.0 and value == 0.2
    assert [s[0] for s in samples] == [1.0, 0.5, 0.25, 0.125]


def test_max_rate_is_where_service_first_breaks_not_a_lucky_rate_above_a_dip():
    """Simulated attainment over 80 trace requests with a learning admission is not monotone (an
    AMX Xeon's plan: 2C@1024 at 0.76 at 7.5 req/s and 0.90 at 8.25, where bisection stopped)."""
    def dipping(rate: float) -> float:
        return 1.0 if rate < 7.0 else 0.8 if rate < 7.6 else 0.95 if rate < 9.0 else 0.5

    rate, value, samples = max_rate(dipping, SearchSettings(rate_hint_rps=1.0, rel_tol=0.01))
    assert 6.9 <= rate < 7.0 and value == 1.0
    assert any(7.0 <= r < 7.6 for r, _ in samples)   # the dip was sampled by the checks below
    assert all(a >= 0.9 for r, a in samples if r <= rate)

    # a monotone curve's answer is what bisection alone gives: the checks below it all pass
    def falling(rate: float) -> float:
        return 1.0 - rate / 50

    rate, _, _ = max_rate(falling, SearchSettings(rate_hint_rps=1.0, rel_tol=0.01))
    assert 4.9 <= rate <= 5.0

    # a break so low that nothing below it passes: zero
    rate, _, _ = max_rate(lambda r: 1.0 if 8.0 <= r < 9.0 else 0.0,
                          SearchSettings(rate_hint_rps=8.0, rel_tol=0.01, min_rate_rps=1.0))
    assert rate == 0.0


def test_max_rate_refuses_an_attainment_that_never_falls():
    with pytest.raises(ValueError, match="does not fall with the rate"):
        max_rate(lambda r: 1.0, SearchSettings())


@pytest.mark.parametrize("rate, disaggregated, colocated", [
    (2.0, Topology.disaggregated(1, 1), Topology.colocated(2)),
    (6.0, Topology.disaggregated(2, 3), Topology.colocated(6)),
    (7.0, Topology.disaggregated(3, 4), Topology.colocated(7)),
])
def test_fewest_devices_answers_the_reverse_question(rate, disaggregated, colocated):
    calls: list[str] = []
    answer = fewest_devices(synthetic_attainment, rate, max_devices=16, progress=calls.append)
    assert answer.disaggregated == (disaggregated, 1.0)
    assert answer.colocated == (colocated, 1.0)
    assert len(calls) < 40  # a staircase walk, not all 120 splits of up to 16 devices


def test_fewest_devices_says_none_when_the_cap_is_too_small():
    answer = fewest_devices(synthetic_attainment, 7.0, max_devices=6)
    assert answer.disaggregated is None and answer.colocated is None and answer.best is None


def test_fewest_devices_searches_every_kind_with_its_variants_and_names_the_fewest():
    # 7 req/s: 3P+4D (7 devices; min(9, 8)); 6C@512 (6 x 1.3); 2P+3H/256 (min(6, 6) + 1.5 = 7.5, 5 devices)
    answer = fewest_devices(synthetic_attainment, 7.0, max_devices=16, kinds=("disaggregated", "hybrid", "aggregated"),
                            local_prefill_caps=(0, 256), token_budgets=(0, 512))
    assert answer.disaggregated == (Topology.disaggregated(3, 4), 1.0)
    assert answer.of("hybrid") == (Topology.hybrid(2, 3, 256), 1.0)
    assert answer.colocated == (Topology.aggregated(6, token_budget=512), 1.0)
    assert answer.best == (Topology.hybrid(2, 3, 256), 1.0)
    assert [kind for kind, _ in answer.by_kind] == ["disaggregated", "hybrid", "aggregated"]


def test_fewest_devices_counts_a_wide_worker_by_its_devices():
    def attainment(topology: Topology, rate_rps: float) -> float:
        capacity = 3.0 * topology.num_colocated if topology.devices_per_instance == 2 else capacity_rps(topology)
        return 1.0 if rate_rps <= capacity else 0.5

    # 5.5 req/s: five one-device workers (5 x 1.1) or two workers over two devices each (2 x 3.0)
    answer = fewest_devices(attainment, 5.5, max_devices=8, kinds=("aggregated",), widths=(1, 2))
    assert answer.colocated == (Topology.aggregated(2, devices_per_instance=2), 1.0)
    assert answer.best[0].devices == 4
    assert fewest_devices(attainment, 5.5, max_devices=8, kinds=("aggregated",)).colocated == \
        (Topology.aggregated(5), 1.0)


def test_plan_fn_over_the_simulator_sizes_pools_for_the_online_planner():
    from loadgen.metrics import SLO
    from planner.decision import SloScale
    from planner.evaluate import make_plan_fn
    from planner.perf_model import fit_perf_model
    from planner.pool_sizes import PoolSizes
    from planner.profiles.example import build_example_profile
    from planner.simulator import SimSettings

    profile = build_example_profile()
    plan = make_plan_fn(SimSettings.from_profile(profile), fit_perf_model(profile).model,
                        SLO(ttft_s=1.0, tpot_s=0.05), max_devices=6, num_requests=200)
    low, high = plan(0.5, 512, 128), plan(5.0, 512, 128)
    assert low == PoolSizes(prefill=1, decode=1)
    assert high is not None and high.decode > low.decode and high.total <= 6
    assert plan(100.0, 512, 128) is None
    tighter = plan(5.0, 512, 128, SloScale(ttft=1.0, tpot=0.4))  # TPOT 20 ms instead of 50
    assert tighter is not None and tighter.decode > high.decode


def test_predict_fn_expects_lower_tpot_from_more_decode_workers():
    from planner.evaluate import make_predict_fn
    from planner.perf_model import fit_perf_model
    from planner.pool_sizes import PoolSizes
    from planner.profiles.example import build_example_profile
    from planner.simulator import SimSettings

    profile = build_example_profile()
    predict = make_predict_fn(SimSettings.from_profile(profile), fit_perf_model(profile).model, num_requests=200)
    ttft_one, tpot_one = predict(PoolSizes(1, 1), 3.0, 512, 128)
    ttft_three, tpot_three = predict(PoolSizes(1, 3), 3.0, 512, 128)
    assert tpot_three < tpot_one and 0 < ttft_one and 0 < ttft_three


def test_the_total_objective_picks_the_highest_goodput_within_the_budget():
    """With 3 devices and no hybrid: per device 1C wins (1.1 req/s per device, 2C and 3C tie it
    but use more); in all 3C does (3.3 req/s), and among the splits 1P+2D (2.0)."""
    per_device = search_splits(synthetic_attainment, 3, SearchSettings(rel_tol=0.01), kinds=NOT_HYBRID,
                               token_budgets=(0,))
    total = search_splits(synthetic_attainment, 3, SearchSettings(rel_tol=0.01), kinds=NOT_HYBRID, objective="total",
                          token_budgets=(0,))
    assert per_device.best.topology == Topology.aggregated(1)
    assert total.best.topology == Topology.aggregated(3)            # 3.3 req/s, the most of all
    assert total.best_of("disaggregated").topology == Topology.disaggregated(1, 2)   # 2.0 > 1P+1D's and 2P+1D's
    with pytest.raises(ValueError, match="objective must be one of"):
        search_splits(synthetic_attainment, 2, objective="most")


def test_plan_fns_of_each_topology_kind_size_their_own_pools():
    from loadgen.metrics import SLO
    from planner.evaluate import make_latency_fn, make_plan_fn
    from planner.perf_model import fit_perf_model
    from planner.pool_sizes import PoolSizes
    from planner.profiles.example import build_example_profile
    from planner.simulator import SimSettings

    profile = build_example_profile()
    settings, model = SimSettings.from_profile(profile), fit_perf_model(profile).model
    plans = {kind: make_plan_fn(settings, model, SLO(ttft_s=1.0, tpot_s=0.05), max_devices=6, num_requests=200,
                                kind=kind) for kind in ("disaggregated", "hybrid", "aggregated")}
    aggregated, hybrid = plans["aggregated"](3.0, 512, 128), plans["hybrid"](3.0, 512, 128)
    assert aggregated is not None and aggregated.prefill == 0 and aggregated.decode >= 1
    assert hybrid is not None and hybrid.prefill >= 1 and hybrid.decode >= 1
    assert plans["aggregated"](100.0, 512, 128) is None
    # an aggregated cluster's sizes are simulated as one (no prefill pool to wait for)
    latency = make_latency_fn(settings, model, num_requests=200)
    assert latency(PoolSizes(0, 2), 1.0, 512, 128).ttft_p90_s > 0


def test_the_online_plan_sizes_aggregated_workers_of_the_deployments_width():
    """Workers over two devices each: the plan counts workers of that width against the device budget,
    simulates them with the wide engine's model, and refuses a width the kind or the profile lacks."""
    import dataclasses

    from loadgen.metrics import SLO
    from planner.evaluate import make_latency_fn, make_plan_fn
    from planner.pool_sizes import PoolSizes
    from planner_testkit import ROUND_MODEL, round_settings

    wide_model = dataclasses.replace(  # one engine over two devices: prefill twice as fast, decode 20% faster
        ROUND_MODEL, prefill=dataclasses.replace(ROUND_MODEL.prefill, per_token_s=0.0005, per_token2_s=5e-7),
        decode=dataclasses.replace(ROUND_MODEL.decode, step_s=0.008, per_seq_s=0.004))
    model = dataclasses.replace(ROUND_MODEL, wide=((2, wide_model),))
    settings, slo = round_settings(num_kv_blocks=400), SLO(ttft_s=1.0, tpot_s=0.1)
    narrow = make_plan_fn(settings, model, slo, max_devices=8, num_requests=100, kind="aggregated")
    wide = make_plan_fn(settings, model, slo, max_devices=8, num_requests=100, kind="aggregated", worker_devices=2)
    one, two = narrow(3.0, 200, 20), wide(3.0, 200, 20)
    assert one is not None and two is not None and one.prefill == two.prefill == 0
    assert two.decode * 2 <= 8 and two.decode < one.decode     # fewer workers: each is twice as wide
    assert wide(100.0, 200, 20) is None                         # beyond four wide workers: none fits
    slow = make_latency_fn(settings, model, num_requests=100)(PoolSizes(0, 1), 1.0, 200, 20)
    fast = make_latency_fn(settings, model, num_requests=100, worker_devices=2)(PoolSizes(0, 1), 1.0, 200, 20)
    assert fast.ttft_p50_s < slow.ttft_p50_s                    # simulated on the wide engine
    with pytest.raises(ValueError, match="aggregated topology only"):
        make_plan_fn(settings, model, slo, max_devices=8, kind="disaggregated", worker_devices=2)
    with pytest.raises(ValueError, match=r"no engine over 4 devices was profiled \(measured widths: \[1, 2\]\)"):
        make_plan_fn(settings, model, slo, max_devices=8, kind="aggregated", worker_devices=4)


def test_workers_wider_than_a_device_only_in_a_cluster_that_stays_aggregated():
    from planner.topology_switch import check_worker_devices

    check_worker_devices(1, ("disaggregated", "aggregated"))
    check_worker_devices(2, ("aggregated",))
    for devices, kinds in ((2, ("disaggregated",)), (2, ("aggregated", "hybrid")), (0, ("aggregated",))):
        with pytest.raises(ValueError, match="a prefill or decode worker is one device"):
            check_worker_devices(devices, kinds)


def test_the_robust_pick_ranks_by_the_goodput_left_on_a_slower_machine():
    """On the nominal machine 1P+1D serves 2.0 req/s and 2C 1.8; on a slower one the split, whose
    SLO margin is its own prefill time, keeps 0.9 and 2C 1.6: the robust pick is 2C, the nominal
    one 1P+1D, and each result carries both rates."""
    nominal = {Topology.disaggregated(1, 1): 2.0, Topology.aggregated(2): 1.8, Topology.aggregated(1): 0.9}
    slower = {Topology.disaggregated(1, 1): 0.9, Topology.aggregated(2): 1.6, Topology.aggregated(1): 0.8}

    def oracle(capacity):
        return lambda topology, rate: 1.0 if rate <= capacity[topology] else 0.5

    settings = SearchSettings(rel_tol=0.01)
    plain = search_splits(oracle(nominal), 2, settings, kinds=NOT_HYBRID, objective="total", token_budgets=(0,))
    robust = search_splits(oracle(nominal), 2, settings, kinds=NOT_HYBRID, objective="total", token_budgets=(0,),
                           robust_attainment=oracle(slower))
    assert plain.best.topology == Topology.disaggregated(1, 1) and plain.best.robust_rate_rps is None
    assert robust.best.topology == Topology.aggregated(2)
    assert robust.best.max_rate_rps == pytest.approx(1.8, rel=0.02)
    assert robust.best.robust_rate_rps == pytest.approx(1.6, rel=0.02)
    split = robust.best_of("disaggregated")
    assert split.max_rate_rps == pytest.approx(2.0, rel=0.02) and split.robust_rate_rps == pytest.approx(0.9, rel=0.02)
