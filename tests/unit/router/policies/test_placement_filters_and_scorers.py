"""Filters keep or drop a path; scorers rate it in [0, 1], clamped at both ends."""

import pytest

from router.policies.placement.config import PlacementConfig
from router.policies.placement.filters import kv_fits, local_allowed, ttft_feasible
from router.policies.placement.paths import Disaggregated, Local, Prediction
from router.policies.placement.scorers import (DEFAULT_WEIGHTS, SCORERS, decode_balance, prefill_balance, prefix_hit,
                                               tpot_headroom, ttft_headroom)
from router.policies.placement.state import RequestView, WorkerView

REQUEST = RequestView(num_prompt_tokens=200, max_tokens=100, ttft_slo_s=1.0, tpot_slo_s=0.1)
ANY = Prediction(ttft_s=0.5, decode_stall_s=0.0, kv_transfer_s=0.0, decode_step_s=0.02)
LOCAL, REMOTE = Local("d0"), Disaggregated("p0", "d0")


def _workers(accepts_local=True, decode_cached=0, kv_blocks_free=1000, decode_running=0, decode_queued=0,
             prefill_queued=0, prefill_cached=0):
    return {"p0": WorkerView("p0", "prefill", False, prefill_queued, 0, 1000, 16, prefill_cached),
            "d0": WorkerView("d0", "decode", accepts_local, decode_queued, decode_running, kv_blocks_free, 16,
                             decode_cached)}


def _prediction(ttft_s=0.0, decode_stall_s=0.0, kv_transfer_s=0.0, decode_step_s=0.0):
    return Prediction(ttft_s, decode_stall_s, kv_transfer_s, decode_step_s)


def test_local_is_dropped_on_a_decode_worker_that_does_not_accept_local_prefills():
    assert local_allowed(LOCAL, ANY, REQUEST, _workers(accepts_local=False), PlacementConfig()) is False
    assert local_allowed(REMOTE, ANY, REQUEST, _workers(accepts_local=False), PlacementConfig()) is True


def test_local_prefill_cap_counts_uncached_tokens_and_zero_means_no_cap():
    capped = PlacementConfig(local_prefill_max_tokens=100)
    assert local_allowed(LOCAL, ANY, REQUEST, _workers(), PlacementConfig()) is True
    assert local_allowed(LOCAL, ANY, REQUEST, _workers(), capped) is False
    assert local_allowed(LOCAL, ANY, REQUEST, _workers(decode_cached=100), capped) is True    # 100 uncached
    assert local_allowed(LOCAL, ANY, REQUEST, _workers(decode_cached=99), capped) is False    # 101 uncached


def test_kv_must_fit_prompt_plus_max_tokens_on_the_decode_worker():
    needed = 19   # ceil((200 + 100) / 16)
    for path in (LOCAL, REMOTE):
        assert kv_fits(path, ANY, REQUEST, _workers(kv_blocks_free=needed), PlacementConfig()) is True
        assert kv_fits(path, ANY, REQUEST, _workers(kv_blocks_free=needed - 1), PlacementConfig()) is False


def test_ttft_feasible_keeps_a_prediction_exactly_at_the_slo():
    assert ttft_feasible(REMOTE, _prediction(ttft_s=1.0), REQUEST, _workers(), PlacementConfig()) is True
    assert ttft_feasible(REMOTE, _prediction(ttft_s=1.001), REQUEST, _workers(), PlacementConfig()) is False


@pytest.mark.parametrize("ttft_s, expected", [(0.0, 1.0), (0.25, 0.75), (1.0, 0.0), (5.0, 0.0)])
def test_ttft_headroom_is_one_minus_ttft_over_slo_clamped(ttft_s, expected):
    assert ttft_headroom(REMOTE, _prediction(ttft_s=ttft_s), REQUEST, _workers()) == pytest.approx(expected)


def test_tpot_headroom_spreads_stall_and_transfer_over_max_tokens():
    prediction = _prediction(decode_stall_s=0.5, kv_transfer_s=0.05, decode_step_s=0.02)
    # per token: 0.02 + 0.5 / 100 + 0.05 / 100 = 0.0255 s against a 0.1 s SLO
    assert tpot_headroom(REMOTE, prediction, REQUEST, _workers()) == pytest.approx(0.745)


@pytest.mark.parametrize("step_s, expected", [(0.0, 1.0), (0.1, 0.0), (3.0, 0.0)])
def test_tpot_headroom_is_clamped_at_both_ends(step_s, expected):
    assert tpot_headroom(LOCAL, _prediction(decode_step_s=step_s), REQUEST, _workers()) == expected


@pytest.mark.parametrize("cached, expected", [(0, 0.0), (150, 0.75), (200, 1.0), (400, 1.0)])
def test_prefix_hit_is_the_cached_share_of_the_prompt_on_the_computing_worker(cached, expected):
    assert prefix_hit(LOCAL, ANY, REQUEST, _workers(decode_cached=cached)) == expected
    assert prefix_hit(REMOTE, ANY, REQUEST, _workers(decode_cached=cached)) == 0.0   # P computes it


@pytest.mark.parametrize("running, expected", [(0, 1.0), (3, 0.25)])
def test_decode_balance_prefers_fewer_running_decodes(running, expected):
    assert decode_balance(REMOTE, ANY, REQUEST, _workers(decode_running=running)) == expected


def test_prefill_balance_counts_prompts_of_this_size_queued_on_the_computing_worker():
    workers = _workers(prefill_queued=200, decode_queued=600)
    assert prefill_balance(REMOTE, ANY, REQUEST, workers) == 0.5
    assert prefill_balance(LOCAL, ANY, REQUEST, workers) == 0.25
    assert prefill_balance(LOCAL, ANY, REQUEST, _workers()) == 1.0


def test_every_scorer_has_a_default_weight():
    assert set(DEFAULT_WEIGHTS) == set(SCORERS)
