"""What each path is predicted to cost: the first token, the decodes it stalls, the KV it moves."""

import pytest

from router.policies.placement.cost import CostModel
from router.policies.placement.paths import Disaggregated, Local, Prediction, predict
from router.policies.placement.state import RequestView, WorkerView

COST = CostModel(fixed_s=0.01, per_token_s=1e-4, per_token2_s=1e-9, step_fixed_s=0.02, step_per_seq_s=0.001,
                 transfer_fixed_s=0.005, transfer_per_token_s=1e-5, local_interference_per_decode=0.05)


def _request(num_prompt_tokens, max_tokens=100):
    return RequestView(num_prompt_tokens, max_tokens, ttft_slo_s=1.0, tpot_slo_s=0.1)


def _prefill(queued=0, cached=0):
    return WorkerView("p0", "prefill", False, queued, 0, 1000, 16, cached)


def _decode(running=0, queued=0, cached=0):
    return WorkerView("d0", "decode", True, queued, running, 1000, 16, cached)


def test_disaggregated_first_token_waits_for_the_prefill_queue_then_its_own_prefill():
    workers = {"p0": _prefill(queued=8000), "d0": _decode(running=3)}
    prediction = predict(Disaggregated("p0", "d0"), _request(200), workers, COST)
    assert prediction == Prediction(ttft_s=pytest.approx(0.874 + 0.03004), decode_stall_s=0.0,
                                    kv_transfer_s=pytest.approx(0.007), decode_step_s=pytest.approx(0.024),
                                    ttft_wait_s=pytest.approx(0.874))   # the queue's part, apart


def test_disaggregated_prefill_skips_the_prefill_workers_cached_prefix():
    workers = {"p0": _prefill(cached=3200), "d0": _decode()}
    prediction = predict(Disaggregated("p0", "d0"), _request(4000), workers, COST)
    assert prediction.ttft_s == pytest.approx(COST.prefill_s(800))
    assert prediction.kv_transfer_s == pytest.approx(COST.kv_transfer_s(4000))   # the whole prompt's KV moves


def test_local_prefill_is_slowed_by_running_decodes_and_stalls_them():
    workers = {"d0": _decode(running=4, queued=1000, cached=160)}
    prediction = predict(Local("d0"), _request(200), workers, COST)
    own_prefill_s = (0.01 + 0.004 + 0.0000016) * 1.2       # 40 uncached tokens, 1 + 0.05 * 4
    assert prediction == Prediction(ttft_s=pytest.approx(0.111 * 1.2 + own_prefill_s + 0.025),
                                    decode_stall_s=pytest.approx(own_prefill_s), kv_transfer_s=0.0,
                                    decode_step_s=pytest.approx(0.025), ttft_wait_s=pytest.approx(0.111 * 1.2))


def test_local_prefill_on_an_idle_decode_worker_stalls_nobody():
    prediction = predict(Local("d0"), _request(200), {"d0": _decode()}, COST)
    assert prediction == Prediction(ttft_s=pytest.approx(0.03004 + 0.021), decode_stall_s=0.0, kv_transfer_s=0.0,
                                    decode_step_s=pytest.approx(0.021))


def test_a_fully_cached_prompt_still_computes_its_last_token():
    request = _request(64)
    assert request.uncached_tokens(_decode(cached=64)) == 1
    assert request.uncached_tokens(_decode(cached=640)) == 1
    prediction = predict(Local("d0"), request, {"d0": _decode(cached=64)}, COST)
    assert prediction.ttft_s == pytest.approx(COST.prefill_s(1) + 0.021)


def test_kv_blocks_needed_rounds_prompt_plus_max_tokens_up_to_whole_blocks():
    assert RequestView(100, 28, 1.0, 0.1).kv_blocks_needed(16) == 8
    assert RequestView(100, 29, 1.0, 0.1).kv_blocks_needed(16) == 9


def test_views_refuse_impossible_values():
    with pytest.raises(ValueError, match="queued_prefill_tokens must be >= 0"):
        WorkerView("d0", "decode", True, -1, 0, 10, 16)
    with pytest.raises(ValueError, match="role must be one of"):
        WorkerView("d0", "both", True, 0, 0, 10, 16)
    with pytest.raises(ValueError, match="SLOs must be > 0 s"):
        RequestView(10, 10, 0.0, 0.1)
    with pytest.raises(ValueError, match=">= 1 prompt token"):
        RequestView(0, 10, 1.0, 0.1)


def test_a_queue_of_prompts_is_charged_prompt_by_prompt():
    """Four queued prompts of 2,000 tokens wait 4 x prefill_s(2000), not prefill_s(8000): the
    quadratic term is each prompt's own (charging the queue as one prompt refused long prompts a
    1P+1D cluster serves)."""
    workers = {"p0": WorkerView("p0", "prefill", False, 8000, 0, 1000, 16, queued_prefill_prompts=4),
               "d0": _decode()}
    prediction = predict(Disaggregated("p0", "d0"), _request(200), workers, COST)
    assert prediction.ttft_s == pytest.approx(4 * COST.prefill_s(2000) + COST.prefill_s(200))
    assert 4 * COST.prefill_s(2000) < COST.prefill_s(8000)


@pytest.mark.parametrize("tokens, prompts, expected_s", [
    (0, 0, 0.0),                                  # an empty queue waits for nothing
    (3000, 0, 0.01 + 0.3 + 0.009),                # prompts not counted: one prompt
    (3000, 1, 0.01 + 0.3 + 0.009),
    (3000, 3, 3 * (0.01 + 0.1 + 0.001)),          # three of 1,000
])
def test_queue_seconds(tokens, prompts, expected_s):
    assert COST.queue_s(tokens, prompts) == pytest.approx(expected_s)


def test_a_view_cannot_hold_more_prompts_than_tokens():
    with pytest.raises(ValueError, match="queued prompts"):
        WorkerView("p0", "prefill", False, 2, 0, 10, 16, queued_prefill_prompts=3)
